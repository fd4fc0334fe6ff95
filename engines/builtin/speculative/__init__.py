"""Speculative decoding: proposers draft tokens, the target model verifies them in one pass.

    proposer.py      the interface every proposer implements (DraftInput, aux layers)
    ngram.py         prompt lookup: drafts copied from the sequence's own context
    eagle3/          EAGLE-3 draft heads: model, checkpoint format, proposer (training: the `training` package)
    factory.py       the proposer an EngineConfig names (none, ngram, eagle3)
    draft_policy.py  how many tokens to draft per sequence, by measured acceptance and step cost
    rejection.py     which drafts the target accepts (greedy, and rejection sampling)
    speculator.py    the engine step's glue: verify rows -> tokens, then the next drafts

The scheduler runs a decoding sequence's drafts after its last token in one row of the step's
forward pass (model_runner: logits at every drafted position, causal within the row); the engine
commits the accepted prefix plus one token of the target's and frees the rejected slots
(Scheduler.accept_drafts, BlockManager.trim). Prefix-cache hashes and KV events only ever cover
committed tokens.
"""
