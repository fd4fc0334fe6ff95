"""The gateway's ASGI application: routes, error rendering in one place, and the lifespan.

`create_app(settings)` builds a Starlette app whose lifespan opens the services (store, backend
client, monitor loops, ...) and closes them at shutdown. Tests and `edgerun dev` may pass their
own store (which then stays theirs to close).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from backends.client import BackendClient
from gateway.errors import AuthenticationFailed, GatewayError, NoRoute, ServiceUnavailable
from gateway.http import api_admin, api_billing, api_finetunes, api_inference
from gateway.http.admin_guard import presented_bearer, token_matches
from gateway.http.dashboard import dashboard_routes
from gateway.http.dashboard.limits import TenantQueries
from gateway.http.drain import Drain, DrainGate
from gateway.http.envelopes import JSONBytes, error_response
from gateway.http.hot_routes import ExceptionHandler, HotRoutes
from gateway.http.listeners import ADMIN, ListenerGate, listener_of
from gateway.http.middleware import RequestContextMiddleware, is_openai_path
from gateway.http.openapi import openapi_document
from gateway.metrics import GatewayMetrics
from gateway.services import Services
from gateway.settings import GatewaySettings
from gateway.store import errors as store_errors
from gateway.store.factory import Store

log = structlog.get_logger("edgerun.gateway.app")

ACCOUNT = "/client/v4/accounts/{account_id}"


def count_error(request: Request, error: GatewayError, status: int) -> None:
    """Errors by code for /metrics and the dashboard (before the lifespan ran there is nothing to count in)."""
    services: Services | None = getattr(request.app.state, "services", None)
    if services is not None:
        services.metrics.errors.labels(str(error.code), str(status)).inc()


async def render_gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    count_error(request, exc, exc.status)
    return error_response(exc, openai=is_openai_path(request.url.path))


async def render_store_unavailable(request: Request, exc: Exception) -> Response:
    # the client sees only "retry shortly": the operator needs the cause (the store's message names no secret)
    log.warning("store_unavailable", path=request.url.path, error=str(exc), cause=repr(exc.__cause__))
    if isinstance(exc, store_errors.StoreFull):  # Redis at maxmemory: the operator must free memory
        message = "the gateway's shared store is full and refuses writes; retry later"
        error = ServiceUnavailable(message, retry_after_s=5.0)
    else:
        error = ServiceUnavailable("the gateway's shared store is unreachable; retry shortly", retry_after_s=1.0)
    count_error(request, error, error.status)
    return error_response(error, openai=is_openai_path(request.url.path))


async def render_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in our envelope (Cloudflare's code 7000, "No route for that URI")."""
    assert isinstance(exc, HTTPException)
    error = NoRoute(f"No route for that URI: {request.method} {request.url.path}")
    response = error_response(error, openai=is_openai_path(request.url.path))
    response.status_code = exc.status_code
    count_error(request, error, exc.status_code)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def healthz(request: Request) -> Response:
    """Liveness plus a summary: 200 while at least one backend is healthy (or none is configured).
    `billing` lists what keeps usage from being billed as the backends served it (e.g. a vLLM that
    does not report cached tokens: gateway/fleet/cached_reports.py); it does not change the status, nor
    does `store` (in a region of several: `tenancy_replica` "up", "down" or "home", `ledger_unshipped`)."""
    g: Services = request.app.state.services
    backends = {s.endpoint.id: s.healthy for s in g.monitor.states.values()}
    ok = not backends or any(backends.values())
    body = {"status": "ok" if ok else "degraded", "backends": backends, "billing": g.monitor.cached_reports.problems()}
    if g.store.health is not None:  # a region: its tenancy copy's link to home, ledger records not yet shipped
        body["store"] = await g.store.health()
    return JSONBytes(body, status_code=200 if ok else 503)


async def metrics(request: Request) -> Response:
    """Prometheus text: open on the admin listener; on a lone public listener it needs
    `Authorization: Bearer <metrics_token>` unless `metrics_public` (gateway/http/listeners.py)."""
    g: Services = request.app.state.services
    s = g.settings
    if listener_of(request.scope) != ADMIN and not s.http.metrics_public:
        expected = s.http.metrics_token.get_secret_value() if s.http.metrics_token is not None else None
        if not token_matches(expected, presented_bearer(request.headers.get("authorization"))):
            hint = "'Authorization: Bearer <metrics_token>'" if expected else "metrics_token, metrics_public or admin_port"
            raise AuthenticationFailed(f"Authentication error: /metrics needs {hint}")
    return PlainTextResponse(g.metrics.render(), media_type=g.metrics.content_type)


async def openapi_json(request: Request) -> Response:
    """The OpenAPI document of every route here (gateway/http/openapi.py)."""
    return JSONBytes(openapi_document())


def inference_routes() -> list[Route]:
    """The POST routes that carry the traffic (also served by `HotRoutes`, gateway/http/hot_routes.py)."""
    return [
        Route(f"{ACCOUNT}/ai/run/{{model:path}}", api_inference.run_model, methods=["POST"]),
        Route(f"{ACCOUNT}/ai/v1/chat/completions", api_inference.chat_completions, methods=["POST"]),
        Route(f"{ACCOUNT}/ai/v1/responses", api_inference.create_response, methods=["POST"]),
        Route(f"{ACCOUNT}/ai/v1/completions", api_inference.completions, methods=["POST"]),
        Route(f"{ACCOUNT}/ai/v1/embeddings", api_inference.embeddings, methods=["POST"]),
    ]


def routes() -> list[Route]:
    return [
        *inference_routes(),
        Route(f"{ACCOUNT}/ai/models/search", api_inference.search_models, methods=["GET"]),
        Route(f"{ACCOUNT}/ai/models/schema", api_inference.model_schema, methods=["GET"]),
        Route(f"{ACCOUNT}/ai/v1/models", api_inference.list_models, methods=["GET"]),
        Route(f"{ACCOUNT}/ai/v1/models/{{model:path}}", api_inference.get_model, methods=["GET"]),
        Route(f"{ACCOUNT}/ai/finetunes", api_finetunes.create_finetune, methods=["POST"]),
        Route(f"{ACCOUNT}/ai/finetunes", api_finetunes.list_finetunes, methods=["GET"]),
        Route(f"{ACCOUNT}/ai/finetunes/{{finetune_id}}/finetune-assets", api_finetunes.upload_asset, methods=["POST"]),
        Route(f"{ACCOUNT}/ai/finetunes/{{finetune_id}}", api_finetunes.delete_finetune, methods=["DELETE"]),
        Route("/admin/v1/tenants", api_admin.create_tenant, methods=["POST"]),
        Route("/admin/v1/tenants", api_admin.list_tenants, methods=["GET"]),
        Route("/admin/v1/tenants/{tenant_id}/keys", api_admin.create_key, methods=["POST"]),
        Route("/admin/v1/tenants/{tenant_id}/keys", api_admin.list_keys, methods=["GET"]),
        Route("/admin/v1/keys/{key_id}", api_admin.revoke_key, methods=["DELETE"]),
        Route("/admin/v1/billing/export", api_billing.billing_export, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        *dashboard_routes(),
    ]


def create_app(
    settings: GatewaySettings, *, store: Store | None = None, client: BackendClient | None = None
) -> Starlette:
    """The gateway app. With `admin_port` set it serves two listeners (gateway/http/listeners.py): the
    dashboard is on both and takes the admin token on the admin listener only."""
    app_metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        services = await Services.open(settings, app_metrics, store=store, client=client)
        app.state.services = services
        services.start(app.state.drain)
        try:
            yield
        finally:
            await services.aclose()

    handlers: dict[type[Exception], ExceptionHandler] = {
        GatewayError: render_gateway_error,
        store_errors.StoreUnavailable: render_store_unavailable,
        HTTPException: render_http_exception,
    }
    app = Starlette(routes=routes(), lifespan=lifespan, exception_handlers=handlers)
    app.add_middleware(HotRoutes, routes=inference_routes(), handlers=handlers)  # innermost: past the gateway's middleware
    app.add_middleware(ListenerGate, split=settings.http.admin_port is not None)
    app.state.drain = drain = Drain(settings.http.shutdown_timeout_s)  # run by Listeners on SIGTERM
    app.state.dashboard_queries = TenantQueries(settings.http.dashboard_max_concurrent_queries)
    app.add_middleware(DrainGate, drain=drain)
    app.add_middleware(RequestContextMiddleware, metrics=app_metrics, worker=settings.http.worker_index)
    return app
