"""`edgerun backend` measured over HTTP, as a gateway reaches it.

    server.py             what the HTTP server costs: streams through it vs the engine in-process
    serving_path.py       batch-1 decode at three depths of the serving path
    llamacpp.py           `edgerun backend` against llama.cpp's llama-server on the same GGUF
    vllm_served.py        vLLM's CPU build as llamacpp.py's `--baseline vllm`: its launch, a KV cache of edgerun's size
    build_llamacpp.sh     builds llama-server from source once, for llamacpp.py
    quant_speed.py        decode speed served, two backends that differ only in weight format
    cold_start.py         exec to the first healthy /health, and where the time goes
    embeddings.py         embedding throughput of `edgerun backend --engine embedding`
"""
