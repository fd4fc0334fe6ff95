"""A pure, deterministic replay of a request trace through the real routing policies.

trace.py parses and prepares requests, kv_cache.py is a backend's LRU block cache,
backend.py its service model, replay.py the loop and its metrics, report.py the table.
"""
