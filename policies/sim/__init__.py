"""A pure, deterministic replay of a request trace through the real routing policies.

trace.py parses and prepares requests (conversations.py derives who continues what),
variants.py builds the evaluation traces, kv_cache.py is a backend's LRU block cache (and its KV
events), backend.py its service model, views.py what a gateway (exact, or one of N replicas)
sees, tiers.py the KV tiers under a backend's pool (its host memory, the region's shared pool),
replay.py the loop and its metrics, report.py the table.
"""
