"""Incremental detokenization and stop strings, with SmolLM2's real tokenizer."""

from __future__ import annotations

import pytest

from engines.base import Tokenizer
from engines.builtin.runner.model_runner import ModelRunner
from engines.builtin.text.detokenizer import IncrementalDetokenizer, StopStringMatcher, TextStream

TEXT = "Caf\u00e9 na\u00efve \u2014 \U0001f600\U0001f680 \u65e5\u672c\u8a9e done."


@pytest.fixture(scope="module")
def tokenizer(smollm2_runner: ModelRunner) -> Tokenizer:
    return smollm2_runner.tokenizer


def test_incremental_text_equals_full_decode_and_never_splits_characters(tokenizer: Tokenizer) -> None:
    prompt = tokenizer.encode("Say it:")
    ids = tokenizer.encode(TEXT)
    assert len(ids) > len(TEXT.split())  # multi-byte characters span several tokens
    detok = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detok.add(t) for t in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == tokenizer.decode(ids)
    assert not any("\ufffd" in d for d in deltas)
    assert "" in deltas  # some tokens were held back until their character completed


def test_stop_matcher_holds_back_possible_prefixes() -> None:
    matcher = StopStringMatcher(["STOP", "end!"])
    assert matcher.feed("hello S") == ("hello ", False)
    assert matcher.feed("T") == ("", False)
    assert matcher.feed("x and e") == ("STx and ", False)  # "STx" cannot start a stop string any more
    assert matcher.feed("nd!") == ("", True)
    assert StopStringMatcher([]).feed("anything") == ("anything", False)
    tail = StopStringMatcher(["xyz"])
    assert tail.feed("abx") == ("ab", False)
    assert tail.flush() == "x"


def test_stop_string_spanning_tokens_is_cut(tokenizer: Tokenizer) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    ids = tokenizer.encode(text)
    pieces = [tokenizer.decode([t]) for t in ids]
    # A stop string made of the end of one token and the start of the next.
    i = next(i for i in range(len(pieces) - 1) if len(pieces[i]) >= 3 and len(pieces[i + 1]) >= 3)
    stop = pieces[i][-2:] + pieces[i + 1][:2]
    assert stop not in pieces[i] and stop not in pieces[i + 1]
    stream = TextStream(tokenizer, [], [stop])
    emitted, hit_at = "", None
    for n, t in enumerate(ids):
        delta, hit = stream.add(t)
        emitted += delta
        if hit:
            hit_at = n
            break
    assert hit_at == i + 1
    assert emitted == text[: text.find(stop)]
