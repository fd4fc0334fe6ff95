"""Guided decoding for the built-in engine: a sequence with a `Guide` samples only tokens its grammar allows.

    backend.py              the Matcher / GrammarBackend seam
    llguidance_backend.py   the library we use (benchmarks/engine/grammar_mask.py says why)
    cache.py                compiled grammars by guide, LRU, thread-safe
    mask.py                 applying a packed bitmask to logits

Per step, the sampler asks each constrained row's matcher for its bitmask and sets forbidden
logits to -inf (other rows of the batch are untouched); after the step each sampled token is fed
to its matcher. When the grammar is complete only the end-of-sequence tokens stay allowed.
"""
