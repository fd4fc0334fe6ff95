"""The edge gateway: Workers AI (and OpenAI-compatible) HTTP in front of regional backends.

Imports run downwards: HTTP -> request pipeline -> fleet, billing -> store. `services.py` is
the composition root that builds the parts from `settings.py`; `app.py` wires them into Starlette.

HTTP (the only modules that speak Starlette)
    app.py            the ASGI app: routes, error rendering in one place, the lifespan's tasks
    listeners.py      the public listener and the optional admin listener, with their limits
    middleware.py     request id, access log, request metrics, last-resort errors
    api_inference.py  `ai/run`, the OpenAI-compatible routes, model search
    api_admin.py      `/admin/v1/...` behind the admin token
    body.py           reading a JSON body within a size bound
    strict_json.py    JSON parsed strictly
    schemas.py        request bodies -> plain data, with the field named when one is wrong
    render.py         a `Generation` -> Workers AI or OpenAI responses, streamed or whole
    sse.py            server-sent event framing for both dialects
    envelopes.py      the JSON bodies the gateway answers with
    errors.py         the errors it answers with (Workers AI code, HTTP status, OpenAI type)

Request pipeline
    generation.py     one generation: auth, limits, routing, the backend stream, settled once
    auth.py           API key -> tenant, account and model checks, rate limits
    concurrency.py    per-tenant requests in flight
    tokenization.py   chat template + tokenizer per model, fetched once and cached
    offload.py        CPU-heavy request work (large bodies, templates, tokenizing) off the event loop
    chat_template.py  a model's Jinja chat template, rendered in a sandbox
    routing.py        prompt tokens -> backends to try, and the in-flight bookkeeping
    disagg.py         the two-step prefill -> decode flow across the prefill and decode pools
    tenant_salt.py    the per-tenant cache salt

Fleet
    catalog.py        model ids -> backend model names and who serves them
    monitor.py        background health, load and KV-event polling of the backends
    kv_index.py       KV cache events -> the store's prefix index

Billing and administration
    metering.py       what a request may spend before it runs, the one ledger record after
    billing/          prices, exports, recomputation, the ledger spool (see billing/__init__.py)
    admin.py          tenants and keys: the service behind the admin API and `edgerun tenants|keys`
    dashboard/        the usage dashboard: a page at /dashboard over a small JSON API

Store and process-wide
    store/            the Store interface, embedded (memory + SQLite) and Redis implementations
    settings.py       the one frozen settings object
    services.py       the parts built once from settings
    metrics.py        Prometheus metrics on the app's own registry

The command line (`edgerun serve`, `edgerun dev`, ...) is the top-level `cli` package.
"""
