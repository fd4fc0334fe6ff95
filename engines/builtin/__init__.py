"""The built-in PyTorch engine (CPU and CUDA), in the nano-vllm manner: imports run one way,
engine.async_engine -> engine.llm_engine -> engine.scheduler -> engine.block_manager -> engine.sequence,
and engine.llm_engine -> runner.model_runner -> runner.model.

    config.py      EngineConfig: plain data, validated once, passed to every part below
    engine/        the engine loop: requests in, `step()`, output deltas out; what runs each step and
                   where its KV blocks live (scheduler, block manager, sequences, KV pins and hand-off)
    runner/        a step's batch -> one forward pass: the model, attention over the paged cache, the
                   linear layers' weight kinds, the fused C++ step and the kernels, sampling
    text/          tokenizer (and the chat template) and the incremental detokenizer
    loader/        GGUF, safetensors and random weights, and the converted-weights cache
    grammar/       guided decoding: grammars compiled to per-step token masks
    speculative/   proposers that draft tokens for the target model to verify (n-gram, EAGLE-3 heads)

Training EAGLE-3 heads is the top-level `training` package's; benchmarks of this engine live in the
top-level `benchmarks` package (benchmarks/engine/).
"""
