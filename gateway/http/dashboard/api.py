"""The dashboard's JSON API: thin handlers over `summary`, scoped by `dashboard_scope`.

    GET /dashboard/api/usage?from=&to=&tenant=&bucket=
        from, to: epoch seconds or ISO 8601 (no zone: UTC), from 1970 to the end of 9999; default the
            last hour up to now.
        tenant: one tenant's records (the admin only; a tenant's key gets its own without asking).
        bucket: seconds per point of the time series; default chosen from the range.
    GET /dashboard/api/tenants
        the tenants the caller may look at (id, name).

Auth: `Authorization: Bearer <admin token>` sees every tenant and may filter by one (on the admin
listener only, when the gateway has one; failures throttled like the admin API's); a tenant's API
key sees its own tenant only, and asking for another is 403 (code 10000). A key's calls count
against its requests per minute like its inference requests (429 / 3040 beyond), and one tenant
runs at most `dashboard_max_concurrent_queries` usage queries at once (limits.py). Errors come in
the Workers AI envelope.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from gateway.billing.export import parse_time
from gateway.billing.prices import PriceHistory
from gateway.billing.savings import savings
from gateway.errors import AuthenticationFailed, InternalError, InvalidInput, TenantForbidden
from gateway.http.admin_guard import token_matches
from gateway.http.dashboard.limits import TenantQueries
from gateway.http.dashboard.summary import BackendLive, ErrorCount, Live, UsageSummary, Window
from gateway.http.envelopes import JSONBytes
from gateway.http.listeners import accepts_admin_token, listener_of
from gateway.metrics import GatewayMetrics
from gateway.pipeline.auth import bearer_token
from gateway.services import Services
from gateway.store.errors import InvalidArgument
from gateway.store.ledger import HOUR_S, Ledger
from policies.errors import PricingError

DEFAULT_SPAN_S = 3600.0
MAX_TIME_S = 253_402_300_799.0  # 9999-12-31T23:59:59Z, the last moment ISO 8601 dates can name
HOURS_PER_TURN = 24  # hourly sums folded between two turns of the event loop
SUMS_PER_READ_S = 86_400  # hourly sums read from the ledger at a time
MAX_SPAN_S = 93 * 86_400.0
NO_STORE = {"cache-control": "no-store"}


@dataclass(frozen=True, slots=True)
class Scope:
    """What a dashboard caller may see: every tenant (the admin) or one."""

    tenant_id: str | None  # None: every tenant
    is_admin: bool


async def dashboard_scope(request: Request) -> Scope:
    """The caller's scope from `Authorization: Bearer <admin token | tenant API key>`, or 401."""
    g: Services = request.app.state.services
    presented = bearer_token(request.headers.get("authorization"))
    if presented is None:
        raise AuthenticationFailed("Authentication error: send the admin token or an API key as 'Bearer <token>'")
    client = request.client.host if request.client is not None else ""
    admin_here = accepts_admin_token(request)  # with a separate admin listener, only there
    if admin_here and token_matches(g.admin_guard.token, presented):
        # 429 while this address is throttled on the dashboard or the admin API
        g.admin_guard.check(f"Bearer {presented}", client, listener_of(request.scope), "dashboard")
        return Scope(tenant_id=None, is_admin=True)
    key = await g.store.tenancy.lookup_key(presented)
    if key is None:
        if admin_here:
            # a wrong admin token, as far as we know (or a tenant's mistyped key: never the admin API's throttle)
            g.admin_guard.record_failure(client, listener_of(request.scope), "dashboard")
        raise AuthenticationFailed("Authentication error: the token is neither the admin token nor a live API key")
    await g.auth.admit_key_request(key)  # 429 once the key's requests per minute are used up
    return Scope(tenant_id=key.tenant_id, is_admin=False)


def tenant_filter(scope: Scope, asked: str | None) -> str | None:
    """The tenant whose records to read: the admin's choice (None: all), a tenant's own, else 403."""
    if scope.is_admin:
        return asked or None
    if asked and asked != scope.tenant_id:
        raise TenantForbidden(f"this API key belongs to tenant {scope.tenant_id!r} and may not see {asked!r}")
    return scope.tenant_id


def _time(value: str | None, name: str, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        moment = float(value)
    except ValueError:
        try:
            moment = parse_time(value, name)
        except ValueError as exc:
            raise InvalidInput(f"{exc} or epoch seconds", param=name) from None
    if not (math.isfinite(moment) and 0 <= moment <= MAX_TIME_S):  # the stores count in 64-bit microseconds
        raise InvalidInput(
            f"{name}={value!r} is out of range: give a time from 1970-01-01 to 9999-12-31 "
            f"(epoch seconds 0 to {MAX_TIME_S:.0f})",
            param=name,
        )
    return moment


def parse_window(request: Request, now: float) -> Window:
    params = request.query_params
    end = _time(params.get("to"), "to", now)
    start = _time(params.get("from"), "from", end - DEFAULT_SPAN_S)
    if end - start > MAX_SPAN_S:
        raise InvalidInput(f"the range is longer than {MAX_SPAN_S / 86_400:.0f} days: narrow from/to", param="from")
    bucket: float | None = None
    if params.get("bucket"):
        try:
            bucket = float(params["bucket"])
        except ValueError:
            raise InvalidInput("bucket must be a number of seconds", param="bucket") from None
    try:
        return Window.auto(start, end, bucket)
    except ValueError as exc:
        raise InvalidInput(str(exc), param="bucket" if bucket is not None else "from") from None


def error_counts(metrics: GatewayMetrics) -> tuple[ErrorCount, ...]:
    """This replica's errors by code since it started (the `edgerun_gateway_errors` counter)."""
    found = []
    for family in metrics.errors.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.value:
                found.append(ErrorCount(int(sample.labels["code"]), int(sample.labels["status"]), int(sample.value)))
    return tuple(sorted(found, key=lambda e: (e.code, e.status)))


async def live_view(g: Services, scope: Scope) -> Live:
    """In-flight tokens and health of every backend, errors by code: the operator's view only."""
    if not scope.is_admin:
        return Live()
    loads = await g.store.routing.loads()
    reports = g.monitor.cached_reports
    backends = tuple(
        BackendLive(
            s.endpoint.id,
            s.endpoint.region,
            s.healthy,
            *loads.get(s.endpoint.id, (0, 0)),
            reports_cached_tokens=(reported := reports.reports(s.endpoint.id)),
            billing_problem=reports.problem(s.endpoint.id) if reported is False else None,
            kv_tier_hit_blocks=dict(s.kv_tier_hit_blocks) or None,
        )
        for s in g.monitor.states.values()
    )
    return Live(backends=backends, errors=error_counts(g.metrics))


async def summarize(ledger: Ledger, window: Window, tenant: str | None, history: PriceHistory) -> UsageSummary:
    """The window's hours that the ledger's hourly sums answer from them, the rest record by record,
    in time order (a backend's region is the one it last had). Sums are read a day at a time and
    folded at once, so a long window never holds them all (nor makes the collector walk them)."""
    summary = UsageSummary(window)
    first = int(window.start // HOUR_S) * HOUR_S
    try:
        loaded = await ledger.hours(first, first + SUMS_PER_READ_S, tenant)
        whole, stretches = window.split(loaded.since)
        parts: list[tuple[float, int | tuple[float, float]]] = [(float(h), h) for h in whole]
        parts += [(start, (start, end)) for start, end in stretches]
        sums = {usage.hour: usage for usage in loaded.hours}
        loaded_until = first + SUMS_PER_READ_S
        for i, (_, part) in enumerate(sorted(parts, key=lambda p: p[0])):
            if isinstance(part, tuple):
                async for record in ledger.iter_usage(*part, tenant):
                    summary.add(record, savings(record, history))  # the store yields to the loop between pages
                continue
            if part >= loaded_until:
                loaded_until = part + SUMS_PER_READ_S
                sums = {usage.hour: usage for usage in (await ledger.hours(part, loaded_until, tenant)).hours}
            if (usage := sums.pop(part, None)) is not None:
                summary.add_hour(usage)
            if i % HOURS_PER_TURN == 0:
                await asyncio.sleep(0)  # the loop serves streams between every few hours' sums
    except InvalidArgument as exc:
        raise InvalidInput(str(exc), param="tenant") from exc
    return summary


def running_query(request: Request, scope: Scope) -> contextlib.AbstractContextManager[None]:
    """One of the tenant's concurrent query slots (429 when they are all taken); none for the admin."""
    if scope.tenant_id is None:
        return contextlib.nullcontext()
    queries: TenantQueries = request.app.state.dashboard_queries
    return queries.slot(scope.tenant_id)


async def usage(request: Request) -> Response:
    g: Services = request.app.state.services
    scope = await dashboard_scope(request)
    tenant = tenant_filter(scope, request.query_params.get("tenant"))
    window = parse_window(request, time.time())
    try:
        history = PriceHistory.from_config(g.settings.billing.prices, g.settings.billing.price_history)
    except PricingError as exc:
        raise InternalError(f"the price configuration is invalid: {exc}") from exc
    with running_query(request, scope):
        summary = await summarize(g.store.ledger, window, tenant, history)
    body = summary.to_json(await live_view(g, scope), tenant=tenant, is_admin=scope.is_admin)
    return JSONBytes(body, headers=NO_STORE)


async def tenants(request: Request) -> Response:
    g: Services = request.app.state.services
    scope = await dashboard_scope(request)
    if scope.is_admin:
        listed = await g.store.tenancy.list_tenants()
    else:
        assert scope.tenant_id is not None  # a key always belongs to a tenant
        own = await g.store.tenancy.get_tenant(scope.tenant_id)
        listed = [own] if own is not None else []
    body = {"admin": scope.is_admin, "tenants": [{"id": t.id, "name": t.name} for t in listed]}
    return JSONBytes(body, headers=NO_STORE)
