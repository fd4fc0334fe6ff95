from __future__ import annotations

import random

from loadtests.words import WORDS, block_text, sentences, words


def test_vocabulary_has_no_duplicates_or_spaces() -> None:
    assert len(set(WORDS)) == len(WORDS) > 300
    assert all(w.isalpha() and w == w.lower() for w in WORDS)


def test_block_text_is_fixed_per_id_and_has_one_word_per_token() -> None:
    assert block_text(7, 16) == block_text(7, 16)
    assert block_text(7, 16) != block_text(8, 16)
    assert len(block_text(7, 16).split()) == 16
    assert block_text(7, 16).startswith(" ")


def test_a_partial_block_is_a_prefix_of_the_full_block() -> None:
    assert block_text(42, 16).startswith(block_text(42, 5))


def test_sentences_have_about_the_requested_words() -> None:
    text = sentences(random.Random(1), 100)
    assert len(text.split()) == 100
    assert text[0].isupper() and text.endswith(".")
    assert words(random.Random(3), 5) == words(random.Random(3), 5)
