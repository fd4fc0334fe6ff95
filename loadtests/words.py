"""Deterministic filler text: words from a fixed vocabulary, chosen by a seeded generator.

Every word here is one token in SmolLM2's byte-level BPE when written with its leading space
(" water"), and a run of them tokenizes word by word, so `block_text(block_id, k)` is exactly k
tokens and the text of several blocks tokenizes as the concatenation of their tokens. That is
what lets a trace replay turn each hash id into a fixed block of tokens and keep the trace's
prefix sharing (tests/loadtests/test_words.py checks it against the real tokenizer).
"""

from __future__ import annotations

import random

WORDS: tuple[str, ...] = tuple(
    """
    the of and to in is it you that he was for on are with as his they be at one have this from
    or had by word but what some we can out other were all there when up use your how said an
    each she which do their time if will way about many then them write would like so these her
    long make thing see him two has look more day could go come did number sound no most people
    my over know water than call first who may down side been now find any new work part take get
    place made live where after back little only round man year came show every good me give our
    under name very through just form great think say help low line differ turn cause much mean
    before move right boy old too same tell does set three want air well also play small end put
    home read hand port large spell add even land here must big high such follow act why ask men
    change went light kind off need house picture try us again animal point mother world near build
    self earth father head stand own page should country found answer school grow study still learn
    plant cover food sun four between state keep eye never last let thought city tree cross farm
    hard start might story saw far sea draw left late run while press close night real life few
    north open seem together next white children begin got walk example ease paper group always
    music those both mark often letter until mile river car feet care second book carry took
    science eat room friend began idea fish mountain stop once base hear horse cut sure watch color
    face wood main enough plain girl usual young ready above ever red list though feel talk bird
    soon body dog family direct leave song measure door product black short class wind question
    happen complete ship area half rock order fire south problem piece told knew pass since top
    whole king space heard best hour better true during hundred five remember step early hold west
    ground interest reach fast seven sing listen six table travel less morning ten simple several
    toward war lay against pattern slow center love person money serve appear road map rain rule
    """.split()
)


def words(rng: random.Random, n: int) -> str:
    """`n` vocabulary words joined by single spaces (no leading space)."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def block_text(block_id: int, num_tokens: int) -> str:
    """The fixed text of one hash block: `num_tokens` words, each with its leading space.

    The same id always gives the same text; different ids almost never share a first word pair.
    """
    rng = random.Random(f"block-{block_id}")
    return "".join(" " + rng.choice(WORDS) for _ in range(num_tokens))


def sentences(rng: random.Random, num_words: int, *, words_per_sentence: tuple[int, int] = (6, 14)) -> str:
    """Roughly `num_words` words as capitalised sentences (documents for the batch user)."""
    out: list[str] = []
    left = num_words
    while left > 0:
        n = min(left, rng.randint(*words_per_sentence))
        sentence = words(rng, n)
        out.append(sentence[0].upper() + sentence[1:] + ".")
        left -= n
    return " ".join(out)
