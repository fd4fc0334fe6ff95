"""The fleet: which backends serve which models, and what the gateway knows about them.

    catalog.py    model ids -> backend model names and who serves them
    monitor.py    background health, load and KV-event polling of the backends
    kv_index.py   KV cache events -> the store's prefix index
    kv_tiers.py   where a block lives (pool, host tier, region pool) as prefix index keys, and back
settings.py   the `[fleet]` section: the models and backends served, how they are watched
outliers.py   outlier ejection: one circuit breaker per backend
cached_reports.py  which backends report the prompt tokens they served from cache
kv_streams.py      vLLM's and SGLang's ZMQ KV event streams
engine_index.py    those events -> the prefix index, one backend at a time
"""
