"""The fleet: which backends serve which models, and what the gateway knows about them.

    catalog.py    model ids -> backend model names and who serves them
    monitor.py    background health, load and KV-event polling of the backends
    kv_index.py   KV cache events -> the store's prefix index
"""
