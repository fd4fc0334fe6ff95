"""Speculative decoding in the built-in engine (prompts: data/prompts.json).

    engine.py          speculation on vs off in the same engine, at several stream counts
    replay.py          draft-length policies replayed offline over the target's greedy answers
    verify_cost.py     what a verify row costs next to a plain decode step
    eagle3_datagen.py  how fast `edgerun draft train` makes its self-distillation data
"""
