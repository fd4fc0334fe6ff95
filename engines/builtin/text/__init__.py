"""Text for the built-in engine.

    tokenizer.py      text <-> ids, and the model's chat template
    detokenizer.py    incremental detokenization and stop strings
"""
