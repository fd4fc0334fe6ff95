"""HTTP: the only part of the gateway that speaks Starlette.

    app.py              the ASGI app: routes, error rendering in one place, the lifespan's tasks
    listeners.py        the public listener and the optional admin listener
    listener_limits.py  what one connection may cost a listener (header sizes, timeouts)
    descriptors.py      the open-file limit, raised at start, and the connection caps fitted under it
    middleware.py       request id, access log, request metrics, last-resort errors
    hot_routes.py       the POST inference routes served past Starlette's exception and routing layers
    api_inference.py    `ai/run`, the OpenAI-compatible routes, model search
    api_admin.py        `/admin/v1/...` tenants and keys, behind the admin token
    api_billing.py      `GET /admin/v1/billing/export`
    api_batch.py        the batch calls of `ai/run` (`queueRequest`): queue a batch, poll it by request_id
    batch_worker.py     runs queued batch items on spare capacity, as their synchronous requests, billed once
    batch_upkeep.py     the batch queue's housekeeping on every gateway: expired answers dropped, depth metrics
    api_finetunes.py    `ai/finetunes`: tenants' LoRA adapters (create, upload assets, list, delete)
    multipart.py        a multipart/form-data body's fields (the finetune asset upload)
    admin.py            tenants and keys: the service behind the admin API and `edgerun tenants|keys`
    admin_guard.py      the admin token check of every admin route (constant time; failures throttled by surface)
    body.py             reading a JSON body within a size bound
    strict_json.py      JSON parsed strictly
    render.py           a `Generation` -> Workers AI or OpenAI responses, streamed or whole
    responses.py        a `Generation` -> an OpenAI Responses API `response` or its stream of events
    sse.py              server-sent event framing for both dialects
    envelopes.py        the JSON bodies the gateway answers with
settings.py         the `[http]` section: listeners, admin API, metrics, bodies, drain
client_headers.py   the client's headers the ledger keeps (`x-session-affinity`, `cf-aig-metadata`)
coalesced_writes.py writes to one client in one turn of the event loop sent as one
drain.py            graceful shutdown's first phase: drain what is in flight, refuse new requests
openapi.py          the OpenAPI 3.1 document at `GET /openapi.json`
    dashboard/          the usage dashboard: a page at /dashboard over a small JSON API
"""
