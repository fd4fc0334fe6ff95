"""The edge gateway: Workers AI (and OpenAI-compatible) HTTP in front of regional backends.

Imports run one way: http -> pipeline -> fleet, billing -> store. `services.py` is the
composition root that builds the parts from `settings.py`; `http/app.py` wires them into Starlette.

    http/        the only package that speaks Starlette: app, listeners, middleware, the API
                 handlers, body parsing, rendering and SSE, admin, the dashboard
    pipeline/    one request from parsed input to a settled result: auth, limits, tokenizing,
                 routing, disaggregation, the backend stream (generation.py, embedding.py)
    fleet/       the backends: the model catalog, health/load/KV-event monitoring, the prefix index
    billing/     metering (budget before, the ledger record after), prices, exports, the spool
    store/       the shared state, one contract per concern (tenancy, admission, routing state,
                 ledger), each local (memory + SQLite) or on Redis

    context.py   who a request is for (the authenticated principal)
    errors.py    the errors the gateway answers with (Workers AI code, HTTP status, OpenAI type)
    settings.py  the one frozen settings object
    services.py  the parts built once from settings
    metrics.py   Prometheus metrics on the app's own registry

The command line (`edgerun serve`, `edgerun dev`, ...) is the top-level `cli` package.
"""
