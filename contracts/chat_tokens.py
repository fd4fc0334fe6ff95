"""Chat prompts as token ids in which only the chat template's own special tokens are control tokens.

A chat template writes control tokens (`<|im_start|>`) around the messages, and a client may write
the same strings in its messages. Tokenizing the rendered prompt as one string reads both as control
tokens, so a user message could close its turn and open a system turn of its own. `ChatTokens`
keeps them apart:

1. `mask` replaces every special-token string in what the client sent (message fields, tool
   definitions) with a marker: a private-use character around a random number;
2. the template renders the masked values, so every special token left in its text is its own;
3. `encode` cuts the text at those special tokens and puts their ids there, and tokenizes the
   text between them, each marker turned back into what the client wrote, with special tokens read
   as plain text (a copy of the tokenizer with `encode_special_tokens` set).

A tokenizer cuts its input at special tokens anyway (and a special token marked lstrip or rstrip
takes the whitespace beside it, as the cuts here do), so when the client wrote no special-token
string the ids are those of tokenizing the rendered text in one call, which is what `encode` then
does. Both the gateway (gateway/pipeline/tokenization.py) and the built-in engine's chat route use
this module, so a prompt gets the same ids on either side.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# What a stripping special token takes beside it: Unicode's White_Space, as Rust's char::is_whitespace
# (str.strip would also take U+001C..U+001F, which the tokenizer leaves)
WHITESPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
)


@dataclass(frozen=True, slots=True)
class Masked:
    """What `ChatTokens.mask` returns: the values with markers, and what each marker stands for."""

    value: Any
    originals: tuple[str, ...] = ()  # the special-token strings the client wrote, in marker order
    marker: re.Pattern[str] | None = None  # None: the client wrote none


class ChatTokens:
    """A tokenizer's special tokens, and the two steps above around a chat template's rendering."""

    def __init__(self, tokenizer: Tokenizer, plain: Tokenizer | None = None) -> None:
        """`plain`: a second instance of the same tokenizer, for the text between special tokens (it is
        set to read special-token strings as text); without one, a copy is made on first need."""
        self._tokenizer = tokenizer
        special = {i: t for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        self._ids = {token.content: i for i, token in special.items()}
        self._lstrip = frozenset(token.content for token in special.values() if token.lstrip)
        self._rstrip = frozenset(token.content for token in special.values() if token.rstrip)
        longest_first = sorted(self._ids, key=len, reverse=True)  # "<|im_start|>" before a shorter prefix of it
        self._special = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None
        self._plain = plain
        if plain is not None:
            plain.encode_special_tokens = True

    def mask(self, value: Any) -> Masked:
        """`value` (strings, lists, tuples and mappings of them) with each special-token string replaced
        by a marker; the same `value` when it holds none."""
        special = self._special
        if special is None or not _holds(special, value):  # the usual case: nothing to copy
            return Masked(value)
        nonce = secrets.randbelow(10**12)  # digits only: no template filter (upper, title) changes them
        originals: list[str] = []

        def swap(match: re.Match[str]) -> str:
            originals.append(match.group())
            return f"\ue000{nonce}.{len(originals) - 1}\ue001"

        def walk(item: Any) -> Any:
            if isinstance(item, str):
                return special.sub(swap, item)
            if isinstance(item, Mapping):
                return {walk(key): walk(child) for key, child in item.items()}
            if isinstance(item, (list, tuple)):
                return type(item)(walk(child) for child in item)
            return item

        return Masked(walk(value), tuple(originals), re.compile(f"\ue000{nonce}\\.(\\d+)\ue001"))

    def encode(self, text: str, masked: Masked) -> list[int]:
        """Token ids of `text`, rendered from `masked.value`: its special tokens as control tokens,
        what the client wrote as plain text."""
        if masked.marker is None:  # every special token in the text is the template's
            return self._tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids
        assert self._special is not None  # a marker means there are special tokens
        pieces, specials, start = [], [], 0
        for match in self._special.finditer(text):
            pieces.append(text[start : match.start()])
            specials.append(match.group())
            start = match.end()
        pieces.append(text[start:])
        for i, special in enumerate(specials):  # the whitespace a stripping special token takes
            if special in self._lstrip:
                pieces[i] = pieces[i].rstrip(WHITESPACE)
            if special in self._rstrip:
                pieces[i + 1] = pieces[i + 1].lstrip(WHITESPACE)
        originals = masked.originals
        restored = [masked.marker.sub(lambda m: originals[int(m.group(1))], piece) for piece in pieces]
        encoded = self._plain_tokenizer().encode_batch_fast(restored, add_special_tokens=False)
        ids = list(encoded[0].ids)
        for special, piece in zip(specials, encoded[1:], strict=True):
            ids.append(self._ids[special])
            ids.extend(piece.ids)
        return ids

    def _plain_tokenizer(self) -> Tokenizer:
        """The instance that reads special-token strings as text (a second one, so the shared one's
        setting stays as it is for concurrent callers; two threads may both build one: harmless)."""
        plain = self._plain
        if plain is None:
            plain = type(self._tokenizer).from_str(self._tokenizer.to_str())
            plain.encode_special_tokens = True
            self._plain = plain
        return plain


def _holds(pattern: re.Pattern[str], value: Any) -> bool:
    """Whether a string anywhere in `value` (strings, lists, tuples, mappings: keys too) matches."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if pattern.search(item):
                return True
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False
