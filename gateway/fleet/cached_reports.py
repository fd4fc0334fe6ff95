"""Which backends say how many prompt tokens they served from their cache, and which do not.

Cached prompt tokens are billed at a discount, and only the backend knows how many it served
from its cache: `usage.prompt_tokens_details.cached_tokens`. vLLM leaves the field out unless
started with `--enable-prompt-tokens-details`, SGLang unless started with `--enable-cache-report`;
the usage then reads 0 cached tokens and the tenant pays the full price for every prompt token.
That is what the gateway bills in that case, on purpose: it never invents a discount the backend
did not report (the prefix index's prediction is a routing hint, not a count). But it must not
happen silently, so `CachedTokenReports`

- probes each backend whose kind may leave the field out, once at start-up (a one-token
  completion), and logs a warning naming the fix when the answer has no such field;
- notes, for every completed request, whether its final usage had the field (counted in
  `edgerun_gateway_cached_tokens_unknown{backend}` when not);
- says what is wrong in `problems()`, which `/healthz` shows under `billing` and the dashboard's
  backend table shows per backend.

A cancelled stream is not evidence either way (vLLM sends the field on the final usage chunk only).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

import structlog

from backends.client import BackendClient, BackendError, Endpoint
from gateway.fleet.catalog import EMBEDDING_TASK, Catalog
from gateway.metrics import GatewayMetrics

log = structlog.get_logger("edgerun.gateway.cached_reports")

PROBE_BODY = {"prompt": "Hello", "max_tokens": 1, "temperature": 0.0}


class CachedTokenReports:
    def __init__(self, endpoints: Iterable[Endpoint], metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self._endpoints = {e.id: e for e in endpoints}
        self._reports: dict[str, bool] = {}  # backend id -> whether its last completed answer had the field

    def note(self, endpoint: Endpoint, reported: bool) -> None:
        """A request completed on `endpoint`; its final usage had cached_tokens or not."""
        if not reported:
            self.metrics.cached_tokens_unknown.labels(endpoint.id).inc()
        before = self._reports.get(endpoint.id)
        self._reports[endpoint.id] = reported
        if before is not reported and not reported:
            log.warning("billing: " + self.problem(endpoint.id), backend=endpoint.id)

    def reports(self, backend_id: str) -> bool | None:
        """True: its answers say how many tokens were cached; False: they do not; None: not known yet."""
        return self._reports.get(backend_id)

    def problem(self, backend_id: str) -> str:
        endpoint = self._endpoints[backend_id]
        fix = endpoint.server.cached_tokens_fix or "its answers must carry usage.prompt_tokens_details.cached_tokens"
        return f"cached tokens unknown for {backend_id}: {fix} (until then its prompt tokens are billed uncached)"

    def problems(self) -> list[str]:
        return [self.problem(backend_id) for backend_id, ok in sorted(self._reports.items()) if not ok]

    async def probe_all(self, client: BackendClient, catalog: Catalog, retry_s: float) -> None:
        """Probe every backend whose kind may leave the field out until each has answered once
        (or real traffic told first); run by the app's lifespan, cancelled at shutdown."""
        pending = {}
        for backend in catalog.backends:
            endpoint = self._endpoints.get(backend.id)
            models = [catalog.get(m) for m in backend.models]
            generating = [m for m in models if m.task != EMBEDDING_TASK]
            if endpoint is None or endpoint.server.cached_tokens_fix is None or not generating:
                continue
            if backend.role == "prefill":
                continue  # a context server answers the context step only
            pending[backend.id] = (endpoint, generating[0].backend_model)
        while pending:
            for backend_id, (endpoint, model) in list(pending.items()):
                if backend_id in self._reports:
                    del pending[backend_id]
                    continue
                reported = await self._probe(client, endpoint, model)
                if reported is not None and backend_id not in self._reports:
                    self.note(endpoint, reported)
                    del pending[backend_id]
            if pending:
                await asyncio.sleep(retry_s)

    async def _probe(self, client: BackendClient, endpoint: Endpoint, model: str) -> bool | None:
        """Whether a one-token completion's final usage has cached_tokens; None when it failed."""
        last = None
        try:
            stream = client.stream_completion(endpoint, {"model": model, **PROBE_BODY})
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    if chunk.has_usage:
                        last = chunk
        except BackendError as exc:
            log.info("cached-token probe failed; will retry", backend=endpoint.id, error=exc.message)
            return None
        return last is not None and last.reports_cached_tokens
