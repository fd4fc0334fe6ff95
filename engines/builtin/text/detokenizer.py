"""Incremental detokenization and stop strings, one `TextStream` per request.

Text is emitted as soon as it is certain: never half a UTF-8 character (a decode that ends in
U+FFFD waits for the next token) and never text that might turn out to be the start of a stop
string (held back until it cannot be, or the request ends). The stop string itself is never
emitted, even when it spans several tokens.
"""

from __future__ import annotations

from engines.base import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
NUM_CONTEXT_TOKENS = 4  # prompt tokens decoded along with the first output, for spacing rules


class IncrementalDetokenizer:
    """Decodes a growing token list into text deltas.

    Keeps a window `tokens[prefix_offset:]`: decoding `tokens[prefix_offset:read_offset]` gives
    the text already emitted for that window, decoding the whole window gives it plus the new
    text. The window slides forward whenever a delta is emitted, so each call costs O(window).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.tokens = list(prompt_token_ids[-NUM_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.tokens)

    def add(self, token_id: int) -> str:
        self.tokens.append(token_id)
        return self._advance(allow_partial=False)

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character is emitted as U+FFFD)."""
        return self._advance(allow_partial=True)

    def _advance(self, allow_partial: bool) -> str:
        if self.read_offset == len(self.tokens):
            return ""
        emitted = self.tokenizer.decode(self.tokens[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.tokens[self.prefix_offset :])
        if (full.endswith(REPLACEMENT_CHAR) and not allow_partial) or len(full) <= len(emitted):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        return full[len(emitted) :]


class StopStringMatcher:
    """Finds stop strings in streamed text, holding back any tail that could start one."""

    def __init__(self, stop: list[str]) -> None:
        self.stop = list(stop)
        self.pending = ""  # text not yet emitted: always a proper prefix of some stop string

    def feed(self, text: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was completed)."""
        if not self.stop:
            return text, False
        buffer = self.pending + text
        matches = [i for i in (buffer.find(s) for s in self.stop) if i >= 0]
        if matches:
            self.pending = ""
            return buffer[: min(matches)], True
        hold = self._longest_stop_prefix_suffix(buffer)
        self.pending = buffer[len(buffer) - hold :]
        return buffer[: len(buffer) - hold], False

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return text

    def _longest_stop_prefix_suffix(self, buffer: str) -> int:
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(buffer)), best, -1):
                if buffer.endswith(s[:k]):
                    best = k
                    break
        return best


class TextStream:
    """Detokenizer + stop strings for one request."""

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], stop: list[str]) -> None:
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids)
        self.matcher = StopStringMatcher(stop)

    def add(self, token_id: int) -> tuple[str, bool]:
        """Text to emit for one more token, and whether a stop string ended the request."""
        return self.matcher.feed(self.detokenizer.add(token_id))

    def finish(self) -> str:
        """The held-back text, when the request ends for another reason than a stop string."""
        text, hit = self.matcher.feed(self.detokenizer.flush())
        return text if hit else text + self.matcher.flush()
