"""One embedding request, from parsed texts to vectors, with its accounting settled once.

`Embedder.embed` bounds the input first: its tokens are counted as an upper bound (a WordPiece
token covers at least one UTF-8 byte, and [CLS] and [SEP] are added: bytes + 2 per text), and a
request over `max_input_tokens` (`embedding_max_input_tokens`) is refused with 413 before it
costs anything. Then it admits the request in one store call (gateway/pipeline/ticket.py): one of
the tenant's concurrency slots, that bound against the key's tokens-per-minute and against the
budget; and it sends the texts to the first healthy
backend serving the model (`POST /v1/embeddings`, with the tenant's cache salt as `user`, which
our embedding backends queue and share their passes by), trying the next one when a backend
cannot be reached or its queue is full (all full: 429 / 3040).

Billing: the backend's usage (its input tokens) is what is billed and what the key's count is
reconciled to: exactly one ledger record per request that reached a backend, whose cost is input
tokens at the model's input price. A backend that refused or failed the request leaves a
`rejected` / `backend_error` record at no cost, with 0 tokens (the backend's count never came);
one never reached leaves no record, only its holds released. A client that hangs up before the
answer (the HTTP layer cancels `embed`) is recorded `cancelled` with 0 tokens, so it costs
nothing: the connection to the backend is closed with it and the backend drops the texts it had
not yet encoded.
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
from gateway.errors import RequestTooLarge
from gateway.fleet.catalog import Catalog
from gateway.fleet.monitor import BackendMonitor
from gateway.pipeline.generation import backend_error_to_gateway, settle_ticket
from gateway.pipeline.holds import Holds, Outcome
from gateway.pipeline.tenant_salt import TenantSalts
from gateway.pipeline.ticket import Admitter
from gateway.store.models import UsageStatus

log = structlog.get_logger("edgerun.gateway.embedding")


@dataclass(frozen=True, slots=True)
class Embedded:
    vectors: list[list[float]]  # one per input text, in order
    usage: Usage  # prompt_tokens: the input tokens the backend encoded
    endpoint: Endpoint


def tokens_upper_bound(texts: tuple[str, ...]) -> int:
    return sum(len(text.encode("utf-8")) + 2 for text in texts)


def check_input_size(texts: tuple[str, ...], max_input_tokens: int) -> int:
    """The texts' token upper bound, or RequestTooLarge naming the limit."""
    bound = tokens_upper_bound(texts)
    if bound > max_input_tokens:
        raise RequestTooLarge(
            f"the texts count up to {bound} input tokens (UTF-8 bytes + 2 per text, the bound the gateway admits "
            f"before the backend encodes them), over this gateway's limit of {max_input_tokens} per embedding "
            "request (embedding_max_input_tokens): send fewer or shorter texts per request",
            param="input",
        )
    return bound


@dataclass(eq=False)
class Embedder:
    """The services one embedding request needs, wired once by the app."""

    catalog: Catalog
    admitter: Admitter
    metering: Metering
    monitor: BackendMonitor
    client: BackendClient
    salts: TenantSalts
    max_input_tokens: int

    async def embed(self, ctx: RequestContext, texts: tuple[str, ...]) -> Embedded:
        """Each hold is pushed onto `Holds` as it is taken (as a generation's are) and settled once."""
        estimate = check_input_size(texts, self.max_input_tokens)
        holds = Holds(ctx.request_id)
        asked: list[Endpoint] = []  # the backends sent the request, in order
        outcome: Outcome | None = None
        try:
            embedded, outcome = await self._embed(ctx, texts, estimate, holds, asked)
            return embedded
        except BackendError as exc:
            outcome = _failure(exc)
            raise backend_error_to_gateway(exc) from exc
        finally:
            await holds.settle(outcome or _cancelled(asked))

    async def _embed(
        self, ctx: RequestContext, texts: tuple[str, ...], estimate: int, holds: Holds, asked: list[Endpoint]
    ) -> tuple[Embedded, Outcome]:
        model = ctx.model
        metered = MeteredRequest(ctx, prompt_tokens=estimate)
        ticket = await self.admitter.admit(metered, estimate, 0)
        holds.push("ticket", settle_ticket(self.metering, metered, ticket), final=True)  # the ledger record: last
        user = await self.salts.salt(ctx.tenant_id)  # the backend's queue shares its passes by tenant
        body = {"model": model.backend_model, "input": list(texts), "encoding_format": "float", "user": user}
        failures: list[BackendError] = []
        for endpoint in self.monitor.healthy_first(self.catalog.endpoints(model.id)):
            asked.append(endpoint)
            try:
                vectors, backend_usage = await self.client.embeddings(endpoint, body, ctx.request_id)
            except BackendUnavailable as exc:  # failed: the next backend may answer
                if not exc.answered:  # never reached it (a failed answer may be the request's own fault)
                    self.monitor.mark_unhealthy(endpoint.id, exc.message)
                self.monitor.record_error(exc, ctx.tenant_id)
                failures.append(exc)
                continue
            except BackendOverloaded as exc:  # its queue is full: the next backend's may not be
                failures.append(exc)
                continue
            usage = Usage(prompt_tokens=backend_usage.prompt_tokens, completion_tokens=0, cached_tokens=0)
            self.monitor.record_success(endpoint.id)  # the breaker counts failures in a row
            outcome = Outcome(usage, "ok", endpoint.id, endpoint.region, streamed=True)
            return Embedded(vectors, usage, endpoint), outcome
        if any(isinstance(exc, BackendOverloaded) for exc in failures):
            raise next(exc for exc in failures if isinstance(exc, BackendOverloaded))
        raise failures[-1] if failures else BackendUnavailable(f"no backend serves {model.id}")


NO_TOKENS = Usage(0, 0, 0)


def _failure(exc: BackendError) -> Outcome:
    """A backend that refused or failed the request is recorded at no cost and with no tokens (it
    never said how many it encoded); one never reached is not recorded."""
    if isinstance(exc, BackendUnavailable) or not exc.endpoint_id:
        return Outcome(NO_TOKENS, "cancelled")
    status: UsageStatus = "rejected" if isinstance(exc, (BackendRejected, BackendOverloaded)) else "backend_error"
    return Outcome(NO_TOKENS, status, exc.endpoint_id)


def _cancelled(asked: list[Endpoint]) -> Outcome:
    """The caller left (or set-up failed) before an answer: recorded `cancelled` with no tokens against
    the backend it was waiting for, if it was sent to one; else nothing is recorded."""
    if not asked:
        return Outcome(NO_TOKENS, "cancelled")
    return Outcome(NO_TOKENS, "cancelled", asked[-1].id, asked[-1].region)
