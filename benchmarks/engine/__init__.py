"""The built-in engine measured in-process (no HTTP).

    compare.py          the engine against transformers (and llama.cpp): `make bench`
    baselines.py        the baselines compare.py runs on the same GGUF weights
    report.py           compare.py's numbers -> its markdown table and machine facts
    runner.py           the model runner alone: decode tokens/s by batch and context, cold start
    prefill.py          a cold 1,000-token prefill, fast and deterministic modes against transformers
    decode_groups.py    what a long sequence costs the decode steps batched with it
    step_split.py       a step split over one-thread workers vs run whole on every thread
    quant_decode.py     decode speed per weight format, the runner alone
    quant_matmul.py     one decode step's matmuls per weight format and batch size
    quant_tolerance.py  how far the fast mode is from the exact model (tests/engines/tolerance.py)
    guided.py           what JSON mode costs inside the engine
    grammar_mask.py     per-token grammar masks: xgrammar against llguidance
    cuda.py             decode and prefill on a CUDA device, random Llama weights
    lora_batch.py       16 streams under 0, 1, 4, 16 distinct LoRA adapters; adapter load time
"""
