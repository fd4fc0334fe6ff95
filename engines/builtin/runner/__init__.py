"""The model runner: one step's batch of new tokens -> one forward pass over the paged KV cache.

    model_runner.py   ModelRunner: packs a step's items and chooses its path (split, fused or forward)
    model.py          the Llama forward pass as small functions
    attention.py      attention over the paged KV cache
    model_config.py   a Llama-family shape and its Hugging Face spelling
    weights.py        the runtime weight layout and each weight's Linear kind (`LlamaWeights.pack`)
    linear.py         the Linear kinds: float16 (fbgemm), int4 (torch's op), GGUF blocks (our kernels)
    quant.py          the GGUF Q4_1 / Q8_0 block formats: finding, checking, converting blocks
    fused_decode.py   a step of a few decodes and verify rows in one C++ call (the q4_1 format)
    thread_choice.py  1 or all threads for a fused step, by recent times
    step_split.py     a step split into parts on one-thread workers (CPU)
    sampler.py        logits -> next tokens (penalties, top-k/p, grammar masks)
    lora.py           per-row LoRA: resident adapters' slots, each row's delta B (A x) (S-LoRA / Punica style)
    kernels/          edgerun's C++ CPU kernels, built once: `python -m engines.builtin.runner.kernels`
"""
