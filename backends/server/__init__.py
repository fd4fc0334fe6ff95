"""The regional backend server: one engine behind the OpenAI-compatible backend protocol.

    app.py        create_app(): the Starlette app, its lifespan (engine load, drain, stop)
    routes.py     thin handlers: parse, call the generation service, render
    protocol.py   request bodies (pydantic)        openai.py     response bodies and SSE chunks
    generation.py admission -> engine -> cleanup   admission.py  bounded admission, lifecycle
    disconnect.py cancel work when the client leaves
    metrics.py    Prometheus series (per-app registry)   kv_events.py  TensorRT-LLM event JSON
    auth.py       the bearer check on every route but GET /health   kv_feed.py  one cursor per event reader
    serve.py      uvicorn with a graceful drain on SIGTERM
state.py      everything one backend app owns: settings, engine, admission, metrics
errors.py     the backend's HTTP errors, all in OpenAI's shape, and their handlers
engine_factory.py  which engine a backend hosts, imported lazily
tokenizer_route.py `GET /edgerun/v1/tokenizer`: the engine's tokenizer, for the gateway
disagg.py     trtllm-serve's context_only / generation_only steps
kv_service.py exporting and importing pinned KV blocks, with their metrics
region_service.py  the region's shared KV pool: fetch a prompt's blocks before prefill, share them after
embedding_app.py      a backend hosting a sentence encoder (`--engine embedding`)
embedding_metrics.py  its Prometheus metrics, read from its batcher at scrape time
"""
