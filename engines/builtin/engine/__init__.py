"""The engine loop: requests in, one `step()` at a time, output deltas out.

    async_engine.py   the `engines.base.Engine` protocol for asyncio servers (a stepping thread)
    llm_engine.py     the synchronous engine: add requests, `step()`, output deltas
    scheduler.py      continuous batching with chunked prefill and preemption: what runs each step
    block_manager.py  paged KV blocks, reference counts, the prefix cache
    host_tier.py      the host-memory tier below the KV pool: evicted blocks kept, copied back on a hit
    sequence.py       one request's tokens, blocks and progress
    kv_events.py      the log of stored/removed blocks that the backend publishes
    kv_pins.py        KV blocks kept after a context step until a decode backend pulls them
    kv_handoff.py     starting a request from KV computed elsewhere (disaggregated serving)
    adapters.py       which LoRA adapters are resident in the runner's slots (LRU, loaded on first use)

Each step the scheduler picks the sequences and token chunks, the block manager gives them KV
blocks, and llm_engine hands the batch to the model runner (engines.builtin.runner).
"""
