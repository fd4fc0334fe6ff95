"""Disaggregated serving: prefill and decode on separate backends, KV moved between them.

    serving.py    disaggregated prefill/decode against two mixed backends, same workload
    kv_import.py  whether importing KV stalls a decode backend's streams
"""
