"""One embedding request, from parsed texts to vectors, with its accounting settled once.

`Embedder.embed` takes one of the tenant's concurrency slots, admits an upper bound of the input
tokens against the key's tokens-per-minute (a WordPiece token covers at least one UTF-8 byte, and
[CLS] and [SEP] are added: bytes + 2 per text), reserves that against the budget, and sends the
texts to the first healthy backend serving the model (`POST /v1/embeddings`), trying the next one
when a backend cannot be reached. The backend's usage (its input tokens) is what is billed and
what the key's count is reconciled to: exactly one ledger record per request, whose cost is
input tokens at the model's input price. A request that no backend answered is recorded like a
failed generation (`rejected` / `backend_error`, at no cost) or, if it never reached one, only
released. A client that leaves mid-request releases everything and is not billed.
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from backends.client import (
    BackendClient,
    BackendError,
    BackendOverloaded,
    BackendRejected,
    BackendUnavailable,
    Endpoint,
)
from contracts.usage import Usage
from gateway.billing.metering import MeteredRequest, Metering
from gateway.context import RequestContext
from gateway.fleet.catalog import Catalog
from gateway.fleet.monitor import BackendMonitor
from gateway.pipeline.auth import Authenticator
from gateway.pipeline.concurrency import TenantSlots
from gateway.pipeline.generation import backend_error_to_gateway, ledger_record, reconcile_tokens
from gateway.pipeline.holds import Holds, Outcome
from gateway.store.models import UsageStatus

log = structlog.get_logger("edgerun.gateway.embedding")


@dataclass(frozen=True, slots=True)
class Embedded:
    vectors: list[list[float]]  # one per input text, in order
    usage: Usage  # prompt_tokens: the input tokens the backend encoded
    endpoint: Endpoint


def tokens_upper_bound(texts: tuple[str, ...]) -> int:
    return sum(len(text.encode("utf-8")) + 2 for text in texts)


class Embedder:
    """The services one embedding request needs, wired once by the app."""

    def __init__(
        self,
        catalog: Catalog,
        auth: Authenticator,
        metering: Metering,
        monitor: BackendMonitor,
        client: BackendClient,
        slots: TenantSlots,
    ) -> None:
        self.catalog = catalog
        self.auth = auth
        self.metering = metering
        self.monitor = monitor
        self.client = client
        self.slots = slots

    async def embed(self, ctx: RequestContext, texts: tuple[str, ...]) -> Embedded:
        """Each hold is pushed onto `Holds` as it is taken (as a generation's are) and settled once."""
        holds = Holds(ctx.request_id)
        estimate = tokens_upper_bound(texts)
        outcome = Outcome(Usage(0, 0, 0), "cancelled")  # until a backend answers or refuses
        try:
            slot = await self.slots.acquire(ctx.principal.tenant, ctx.request_id)
            if slot is not None:
                holds.push("concurrency", lambda _: slot.release())
            embedded, outcome = await self._embed(ctx, texts, estimate, holds)
            return embedded
        except BackendError as exc:
            outcome = _failure(exc, estimate)
            raise backend_error_to_gateway(exc) from exc
        finally:
            await holds.settle(outcome)

    async def _embed(
        self, ctx: RequestContext, texts: tuple[str, ...], estimate: int, holds: Holds
    ) -> tuple[Embedded, Outcome]:
        model = ctx.model
        await self.auth.admit_tokens(ctx.principal, estimate)
        holds.push("tokens", reconcile_tokens(self.auth, ctx.principal, estimate))
        metered = MeteredRequest(ctx, prompt_tokens=estimate)
        await self.metering.reserve(metered, 0)
        holds.push("budget", ledger_record(self.metering, metered), final=True)  # the ledger record: written last
        body = {"model": model.backend_model, "input": list(texts), "encoding_format": "float"}
        failure: BackendError = BackendUnavailable(f"no backend serves {model.id}")
        for endpoint in self.monitor.healthy_first(self.catalog.endpoints(model.id)):
            try:
                vectors, backend_usage = await self.client.embeddings(endpoint, body, ctx.request_id)
            except BackendUnavailable as exc:  # failed: the next backend may answer
                if not exc.answered:  # never reached it (a failed answer may be the request's own fault)
                    self.monitor.mark_unhealthy(endpoint.id, exc.message)
                self.monitor.record_error(exc, ctx.tenant_id)
                failure = exc
                continue
            usage = Usage(prompt_tokens=backend_usage.prompt_tokens, completion_tokens=0, cached_tokens=0)
            self.monitor.record_success(endpoint.id)  # the breaker counts failures in a row
            outcome = Outcome(usage, "ok", endpoint.id, endpoint.region, streamed=True)
            return Embedded(vectors, usage, endpoint), outcome
        raise failure


def _failure(exc: BackendError, prompt_tokens: int) -> Outcome:
    """A backend that refused or failed the request is recorded at no cost; one never reached is not recorded."""
    if isinstance(exc, BackendUnavailable) or not exc.endpoint_id:
        return Outcome(Usage(0, 0, 0), "cancelled")
    status: UsageStatus = "rejected" if isinstance(exc, (BackendRejected, BackendOverloaded)) else "backend_error"
    return Outcome(Usage(prompt_tokens, 0, 0), status, exc.endpoint_id)
