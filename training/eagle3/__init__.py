"""Train and measure an EAGLE-3 draft head for the built-in engine's target: `edgerun draft train|eval`.

    pipeline.py       the two jobs behind `edgerun draft`: train a head, measure one
    prompts.py        the prompt set (seeds plus variations) and its held-out split
    prompt_seeds.py   handwritten seed prompts: chat, tool calls, JSON, code
    datagen.py        self-distillation data: the target's answers and hidden states, in shards
    features.py       the target's hidden states over whole sequences (one teacher-forced pass)
    dataset.py        the shards read back and packed into training batches
    ttt.py            the training-time-test loss: drafts unrolled over several steps
    train.py          the training loop (AdamW, warm-up and cosine decay, resumable state)
    evaluate.py       mean accepted length at k = 1..max_k drafts
    export.py         a trained head written as the directory the engine loads

The head's model, its loader and its proposer are the serving engine's
(engines/builtin/speculative/eagle3/): a trained head is a directory that
`--speculative-model DIR` loads.
"""
