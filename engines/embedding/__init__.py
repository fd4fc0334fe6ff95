"""Sentence embeddings: a BERT-family encoder with its sentence-transformers pooling (see encoder.py)."""
