"""The built-in PyTorch engine (CPU and CUDA), in the nano-vllm manner: imports run one way,
async_engine -> llm_engine -> scheduler -> block_manager -> sequence, and llm_engine ->
model_runner -> model.

Serving
    async_engine.py   the `engines.base.Engine` protocol for asyncio servers (a stepping thread)
    llm_engine.py     the synchronous engine: add requests, `step()`, output deltas
    config.py         EngineConfig: plain data, validated once

Deciding what runs
    scheduler.py      continuous batching with chunked prefill, preemption
    block_manager.py  paged KV blocks, reference counts, the prefix cache
    sequence.py       one request's tokens, blocks and progress
    kv_events.py      the log of stored/removed blocks that the backend publishes

Running the model
    model_runner.py   a batch's new tokens -> one forward pass over the paged cache
    model.py          the Llama forward pass as small functions
    attention.py      attention over the paged KV cache
    sampler.py        logits -> next tokens
    model_config.py   a Llama-family shape and its Hugging Face spelling
    weights.py        runtime weight layout, float16 linear weights on CPU
    loader/           GGUF, safetensors and random weights, and the converted-weights cache
    speculative/      proposers that draft tokens for the target model to verify

Text
    tokenizer.py      text <-> ids and the chat template
    detokenizer.py    incremental detokenization and stop strings

Benchmarks of this engine live in the top-level `benchmarks` package (engine.py, runner.py).
"""
