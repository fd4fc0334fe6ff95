"""The regional backend: `server/` hosts one engine behind the OpenAI-compatible backend protocol;
`client/` is the seam the gateway uses to reach any such backend (ours, trtllm-serve, vLLM, SGLang).

    server/        the backend server: one engine behind the backend protocol
    client/        the gateway's one way to a backend (HTTP, one module per kind of server, ZMQ KV events)
    kv_transfer/   moving KV blocks between backends (disaggregated serving)
    settings.py    a backend process's settings: one frozen object built at start-up
"""
