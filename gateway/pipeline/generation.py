"""One text generation, from parsed input to a backend stream, with its accounting settled once.

`Generator.start` runs the request path in order: wait for a place in the setup gate
(`gateway.pipeline.setup_gate`), tokenize once (chat template + tokenizer; large prompts on the
offload pool), check the context length, route (one store read), admit (one store call: a
concurrency slot, the key's tokens-per-minute, the budget reservation and the tokens in flight on
the chosen backend, gateway/pipeline/ticket.py; its request was counted against requests-per-minute
on arrival, before the body was read), leave the gate, and open the backend stream with failover
before the first byte. Anything that fails before the stream opens gives back what was taken and
raises a `GatewayError`, so the client gets a proper status. A request
with `options.rejectIfBusy` waits for nothing: where it would wait (a place in the gate, a backend's
queue) it is answered 429 / 3040 at once (`gateway.errors.busy`).

The returned `Generation` yields text deltas as the backend sends them, a list per read of the
backend's stream (the deltas that arrived together go on together). However it ends -
completed, cancelled because the client went away (the backend request is closed at once, so
the backend aborts it), or broken mid-stream - its `finally` settles the request in one store call: the slot and the in-flight
tokens given back, the key's token count reconciled, the budget settled and exactly one usage
record written: a cancelled stream is billed for the tokens generated so far, its cached prompt tokens at the cached rate (the backend
client asks for the usage so far on every chunk: `continuous_usage_stats`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

import structlog

from backends.client import (
    BackendClient,
    BackendError,
    BackendOverloaded,
    BackendRejected,
    BackendStreamBroken,
    BackendTimeout,
    ClientAtCapacity,
    CompletionChunk,
    Endpoint,
)
from contracts.usage import Usage
from gateway.billing.metering import MeteredRequest, Metering
from gateway.context import RequestContext
from gateway.errors import (
    ConcurrencyLimited,
    GatewayError,
    InternalError,
    InvalidInput,
    OutOfCapacity,
    RequestTimeout,
    busy,
)
from gateway.fleet.catalog import Catalog, ModelSpec
from gateway.fleet.monitor import BackendMonitor
from gateway.fleet.outliers import is_connection_failure
from gateway.metrics import GatewayMetrics
from gateway.pipeline.disagg import Attempt, Disaggregator, Pools
from gateway.pipeline.holds import Holds, Outcome, Release, run_to_end
from gateway.pipeline.offload import Offload
from gateway.pipeline.routing import Flight, Router
from gateway.pipeline.schemas import GenerationInput
from gateway.pipeline.setup_gate import Place, SetupGate
from gateway.pipeline.ticket import Admitter, Ticket
from gateway.pipeline.tokenization import ModelTokenizer, TokenizerRegistry
from gateway.store.admission import Inflight
from gateway.store.errors import StoreUnavailable
from gateway.store.models import UsageStatus

log = structlog.get_logger("edgerun.gateway.generation")


def backend_error_to_gateway(exc: BackendError, *, reject_if_busy: bool = False) -> GatewayError:
    """The client-facing error for a backend failure before the first byte (no internal URLs leak);
    `reject_if_busy`: capacity refusals in Workers AI's words for options.rejectIfBusy."""
    if reject_if_busy and isinstance(exc, (ClientAtCapacity, BackendOverloaded)):
        return busy(exc.retry_after_s)
    if isinstance(exc, ClientAtCapacity):
        return OutOfCapacity(
            "Out of capacity: this gateway has all its backend connections open (backend_max_connections); "
            "retry shortly",
            retry_after_s=exc.retry_after_s,
        )
    if isinstance(exc, BackendOverloaded):
        return OutOfCapacity(
            "Out of capacity: every backend for this model is busy; retry shortly",
            retry_after_s=exc.retry_after_s or 1.0,
        )
    if isinstance(exc, BackendTimeout):
        return RequestTimeout("Request timeout: the backend did not start answering in time")
    if isinstance(exc, BackendRejected):
        if exc.status in (400, 413, 422):
            message = exc.message.split(": ", 1)[-1]
            return InvalidInput(f"the backend refused the request: {message}")
        return InternalError(f"the backend answered {exc.status}")
    return OutOfCapacity(
        "No more data centers to forward the request to: every backend for this model failed; retry shortly",
        retry_after_s=1.0,
    )


class Generation:
    """An open backend stream; iterate `text_batches()` once (or call `collect()`)."""

    def __init__(
        self,
        metered: MeteredRequest,
        flight: Flight,
        endpoint: Endpoint,
        chunks: AsyncIterator[list[CompletionChunk]],
        tokenizer: ModelTokenizer,
        sampling_max_tokens: int,
        holds: Holds,
        watch: StreamWatch,
    ) -> None:
        self.ctx = metered.ctx  # the request's one context
        self.metered = metered
        self.flight = flight
        self.endpoint = endpoint
        self._chunks = chunks
        self._tokenizer = tokenizer
        self._max_tokens = sampling_max_tokens
        self._parts: list[str] = []
        self._num_token_ids = 0  # token ids received, when the backend sends them
        self._finished = False
        self._backend_usage: Usage | None = None
        self._reports_cached = False  # whether that usage said how many prompt tokens were cached
        self._first_text_at: float | None = None  # perf_counter() of the first and last text received
        self._last_text_at: float | None = None
        self.finish_reason: str | None = None
        self.usage: Usage | None = None  # set once the stream is over
        self.holds = holds  # everything the request holds, released once when it is settled
        self._watch = watch
        self.created = int(time.time())
        # called once the text is over and settled, when the stream ended normally (the response cache)
        self.on_complete: Callable[[Generation], Awaitable[None]] | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.metered.prompt_tokens

    async def text_batches(self) -> AsyncGenerator[list[str], None]:
        """The text deltas of each read of the backend's stream, as they arrive (never an empty list);
        raises a GatewayError if the stream breaks midway."""
        status: UsageStatus = "cancelled"
        deadline_s = self._watch.deadline_s
        deadline = self.ctx.arrived_perf + deadline_s if deadline_s is not None else None
        try:
            async for batch in self._chunks:
                # a stalled backend hits the read timeout; one that trickles would go on for ever
                if deadline is not None and time.perf_counter() > deadline:
                    log.warning("request deadline reached", backend=self.endpoint.id, request_id=self.ctx.request_id)
                    raise RequestTimeout(
                        f"Request timeout: the answer took longer than request_deadline_s ({deadline_s:g}s); "
                        "ask for fewer max_tokens or retry"
                    )
                texts = []
                reported: CompletionChunk | None = None  # the last usage report of the batch: read once
                for chunk in batch:
                    if chunk.has_usage:
                        reported = chunk
                    if chunk.finish_reason is not None:
                        self.finish_reason = chunk.finish_reason
                    if chunk.token_ids:
                        self._num_token_ids += len(chunk.token_ids)
                    if chunk.text:
                        texts.append(chunk.text)
                if reported is not None:
                    self._backend_usage = reported.usage
                    self._reports_cached = reported.reports_cached_tokens
                if texts:
                    self._last_text_at = now = time.perf_counter()
                    if self._first_text_at is None:
                        self._first_text_at = now
                        self._watch.metrics.ttft.labels(self.ctx.model.id).observe(now - self.ctx.arrived_perf)
                        await self._watch.first_token(self.flight)
                    self._parts += texts
                    yield texts
            status = "ok"
        except BackendStreamBroken as exc:
            status = "backend_error"
            log.warning("backend stream broke", backend=self.endpoint.id, error=exc.message)
            self._watch.monitor.record_error(exc, self.ctx.tenant_id)
            raise InternalError("the backend failed while generating the answer; retry the request") from exc
        finally:
            await self._finish(status)
        if self.on_complete is not None:  # reached only when the stream ended normally
            await self.on_complete(self)

    async def collect(self) -> str:
        async for _ in self.text_batches():
            pass
        return self.text

    async def aclose(self) -> None:
        """Settle a generation whose text was never (fully) read, e.g. the client left before the
        response started; a no-op once `text_batches` has finished."""
        await self._finish("cancelled")

    @property
    def text(self) -> str:
        return "".join(self._parts)

    @property
    def deltas(self) -> tuple[str, ...]:
        """The text deltas received so far, in order."""
        return tuple(self._parts)

    def _final_usage(self, status: UsageStatus) -> Usage:
        backend = self._backend_usage
        if status == "ok" and backend is not None:
            return Usage(
                backend.prompt_tokens, backend.completion_tokens, min(backend.cached_tokens, backend.prompt_tokens)
            )
        # Cancelled, broken, or a backend that sent no usage: count what was received, by the ids the
        # backend sent with each chunk, else by re-tokenizing the text.
        if self._num_token_ids:
            completion = self._num_token_ids
        else:
            completion = len(self._tokenizer.encode_text(self.text)) if self._parts else 0
        completion = min(completion, self._max_tokens)
        if backend is not None:
            completion = max(completion, backend.completion_tokens)
        cached = backend.cached_tokens if backend is not None else 0
        return Usage(self.prompt_tokens, completion, min(cached, self.prompt_tokens))

    def _timings(self, usage: Usage) -> None:
        """Time to first text and the mean inter-token gap, onto the ledger record and /metrics."""
        first, last = self._first_text_at, self._last_text_at
        if first is None or last is None:
            return
        self.metered.ttft_s = round(first - self.ctx.arrived_perf, 6)
        if usage.completion_tokens >= 2:
            itl = (last - first) / (usage.completion_tokens - 1)
            self.metered.itl_s = round(itl, 6)
            self._watch.metrics.inter_token.labels(self.ctx.model.id).observe(itl)

    async def _finish(self, status: UsageStatus) -> None:
        """Close the backend stream and settle, once, to the end even if this task is cancelled
        meanwhile (`run_to_end`: anyio's shields do not stop `Task.cancel()`)."""
        if self._finished:
            return
        self._finished = True
        await run_to_end(self._close_and_settle(status))

    async def _close_and_settle(self, status: UsageStatus) -> None:
        try:
            await self._chunks.aclose()  # type: ignore[attr-defined]  # drops the connection: the backend aborts
        except Exception:  # the record below must be written whatever the connection did
            log.exception("closing the backend stream failed", request_id=self.ctx.request_id)
        if status == "ok" or (status == "cancelled" and (self._parts or self._num_token_ids)):
            self._watch.monitor.record_success(self.endpoint.id)  # a stream that produced tokens works
        if status == "ok" and self._backend_usage is not None:  # its final usage: did it say how much was cached?
            self._watch.monitor.cached_reports.note(self.endpoint, self._reports_cached)
        usage = self._final_usage(status)
        self.usage = usage
        self._timings(usage)
        metrics, model = self._watch.metrics, self.ctx.model.id
        metrics.tokens.labels(model, "prompt").inc(usage.prompt_tokens)
        metrics.tokens.labels(model, "completion").inc(usage.completion_tokens)
        metrics.cached_tokens.labels(model).inc(usage.cached_tokens)
        outcome = Outcome(usage, status, self.endpoint.id, self.endpoint.region, streamed=True)
        await self.holds.settle(outcome)


@dataclass(frozen=True, slots=True)
class StreamWatch:
    """What an open stream reports to while it runs (the parts it needs, not the Generator)."""

    metrics: GatewayMetrics
    monitor: BackendMonitor
    first_token: Callable[[Flight], Awaitable[None]]  # moves the flight's prefill tokens out of in-flight
    deadline_s: float | None  # a whole generation's limit, from its arrival (request_deadline_s)


@dataclass(eq=False)
class Generator:
    """The services one generation needs, wired once by the app."""

    catalog: Catalog
    tokenizers: TokenizerRegistry
    metering: Metering
    router: Router
    monitor: BackendMonitor
    client: BackendClient
    metrics: GatewayMetrics
    admitter: Admitter
    disagg: Disaggregator
    offload: Offload | None = None  # large prompts are templated and tokenized there, off the event loop
    # requests in their CPU-bound setup at once (setup_gate.py)
    setup: SetupGate = field(default_factory=lambda: SetupGate(32))
    deadline_s: float | None = None  # a whole generation's limit, from its arrival (request_deadline_s)

    async def tokenizer(self, model: ModelSpec) -> ModelTokenizer:
        return await self.tokenizers.get(model, lambda: self.monitor.healthy_first(self.catalog.endpoints(model.id)))

    async def start(self, ctx: RequestContext, inp: GenerationInput) -> Generation:
        """Admit the request (429 when its tenant's slots, its key's tokens or its budget are used up),
        then open its stream. With `options.rejectIfBusy` nothing waits for capacity: a full tenant,
        setup gate or backend connection cap, or every backend's running batch full, answers `busy()`
        at once. Each hold is pushed onto `Holds` as it is taken; the generation settles them once it
        is over, and a request that never opens settles what it took here."""
        holds = Holds(ctx.request_id)
        holds.push("trial", self._end_trials(ctx.request_id))
        try:
            async with self.setup.enter(may_wait=not inp.reject_if_busy) as place:
                return await self._set_up_and_open(ctx, inp, place, holds)
        except BaseException:
            await holds.settle(Outcome(Usage(0, 0, 0), "cancelled"))  # a no-op if the failure settled them
            raise

    async def _set_up_and_open(
        self, ctx: RequestContext, inp: GenerationInput, place: Place, holds: Holds
    ) -> Generation:
        model = ctx.model
        tokenizer = await self.tokenizer(model)
        prompt_ids = await tokenizer.encode(inp.prompt, self.offload)
        max_tokens = inp.sampling.max_tokens
        if len(prompt_ids) + max_tokens > tokenizer.max_model_len:
            raise InvalidInput(
                f"the prompt has {len(prompt_ids)} tokens and max_tokens is {max_tokens}, but {model.id} "
                f"has a context of {tokenizer.max_model_len} tokens: shorten the prompt or lower max_tokens",
                param="max_tokens",
            )
        estimate = len(prompt_ids) + max_tokens
        metered = MeteredRequest(ctx, prompt_tokens=len(prompt_ids))
        attempt = Attempt(reject_if_busy=inp.reject_if_busy)
        endpoints = self.catalog.endpoints(model.id)

        async def route(pool: list[Endpoint], num_output_tokens: int) -> Flight:
            return await self.router.route(ctx, pool, prompt_ids, num_output_tokens)

        pools = Pools.of(endpoints)
        flight: Flight | None = None
        if pools is None:  # the request's tokens in flight are counted with its admission
            flight = await self.router.route(ctx, endpoints, prompt_ids, max_tokens, count=False)
        try:  # the request itself was counted on arrival
            ticket = await self.admitter.admit(metered, estimate, max_tokens, None if flight is None else flight.inflight)
        except BaseException as exc:
            if flight is not None:  # routed, never counted: the policy forgets it
                await self.router.finish(flight, success=False)
            if isinstance(exc, ConcurrencyLimited) and inp.reject_if_busy:
                raise busy(exc.retry_after_s) from exc
            raise
        finish = None if flight is None else partial(self._finish_counted, flight)
        holds.push("ticket", settle_ticket(self.metering, metered, ticket, finish), final=True)  # the record: last
        try:
            cache_salt = await self.router.salts.salt(ctx.tenant_id)
            body = {
                # a finetune is asked for by its id, vLLM's convention for a LoRA adapter (finetunes.py)
                "model": ctx.adapter or model.backend_model,
                "prompt": prompt_ids,
                **inp.sampling.backend_fields(),
                "cache_salt": cache_salt,  # HMAC of the tenant id: not guessable (gateway/pipeline/tenant_salt.py)
                "user": ctx.request_id,
            }
            if model.return_token_ids:
                body["return_token_ids"] = True
            if inp.backend_response_format is not None:  # JSON mode or tool calls: the backend's grammar
                body["response_format"] = inp.backend_response_format
            if flight is not None:
                attempt.flights.append(flight)
                place.leave()  # the setup is done: waiting for the backend holds no place
                endpoint, chunks = await self.client.stream_with_failover(
                    flight.endpoints, body, attempt.on_failure(self.monitor.errors_of(ctx.tenant_id, ctx.request_id)),
                    ctx.request_id, may_try=lambda e: self.monitor.may_try(e, ctx.request_id),
                    reject_if_busy=inp.reject_if_busy, adapter=ctx.adapter,  # a vLLM loads it first
                )
            else:
                assert pools is not None
                place.leave()
                opened = await self.disagg.open(ctx, attempt, route, pools, body, max_tokens)
                flight, endpoint, chunks = opened.flight, opened.endpoint, opened.chunks
        except BaseException as exc:
            if pools is not None:  # each disaggregated step's flight was counted by its route
                for tried in attempt.flights:
                    holds.push("route", self._finish_flight(tried))
            await holds.settle(_failure(exc, metered, attempt.flights))
            if isinstance(exc, BackendError):
                log.warning("no backend answered", error=exc.message, request_id=ctx.request_id)
                raise backend_error_to_gateway(exc, reject_if_busy=inp.reject_if_busy) from exc
            raise
        # The backend answered its first event: as a trial this request has done its part, so a backend
        # on trial may take the next request now rather than after this whole stream (policies/breaker.py)
        self.monitor.end_trials(ctx.request_id)
        for other in attempt.flights:  # a disaggregated request's other step is over
            if other is not flight:
                await self.router.finished(other, success=True)
        if pools is not None:  # counted by its route: released by its own hold
            holds.push("route", self._finish_flight(flight))
        watch = StreamWatch(self.metrics, self.monitor, self.may_count_first_token, self.deadline_s)
        generation = Generation(metered, flight, endpoint, chunks, tokenizer, max_tokens, holds, watch)
        try:
            for failed in attempt.failed:  # the endpoints the client failed over, as it reported them
                # not a failed answer (one request may cause those) nor a 429 (a busy backend is healthy)
                if failed.endpoint_id is not None and is_connection_failure(failed):
                    self.monitor.mark_unhealthy(failed.endpoint_id, "failed before its first byte")
            await self.router.started(flight, endpoint)
        except StoreUnavailable as exc:  # bookkeeping only: the answer is on its way, let it through
            log.warning("recording the route failed", error=exc.args[0], request_id=ctx.request_id)
        except BaseException:  # the stream is open: close it and write its record
            await generation.aclose()
            raise
        return generation

    async def may_count_first_token(self, flight: Flight) -> None:
        """Move the flight's prefill tokens out of the in-flight count; a store outage must not
        break a stream that is already flowing (the backend's /load report corrects the counts)."""
        try:
            await self.router.first_token(flight)
        except StoreUnavailable as exc:
            log.warning("counting the first token failed", error=exc.args[0])

    def _end_trials(self, request_id: str) -> Release:
        async def release(_: Outcome) -> None:  # a trial this request ended without a verdict is free again
            self.monitor.end_trials(request_id)

        return release

    async def _finish_counted(self, flight: Flight, success: bool) -> Inflight | None:
        return await self.router.finish(flight, success=success)

    def _finish_flight(self, flight: Flight) -> Release:
        async def release(outcome: Outcome) -> None:
            await self.router.finished(flight, success=outcome.status == "ok")

        return release


FinishFlight = Callable[[bool], Awaitable[Inflight | None]]  # (success) -> the tokens its flight still counts


def settle_ticket(metering: Metering, metered: MeteredRequest, ticket: Ticket, finish: FinishFlight | None = None
                  ) -> Release:
    """The request's one settle: everything its ticket holds (with its flight's tokens still in flight,
    `finish`, when its admission counted them) given back, and its ledger record written, in one store
    call. A request that never reached a backend gives everything back without a record; one a
    backend refused or failed on before its first byte is recorded at no cost (`billing.rules`)."""

    async def release(outcome: Outcome) -> None:
        left = None if finish is None else await finish(outcome.status == "ok")
        tokens_used = outcome.usage.total_tokens if outcome.streamed else 0  # what the backend used vs the estimate
        given_back = ticket.release(tokens_used, left)
        if outcome.backend_id is None:
            await metering.release(metered, given_back)
        else:
            await metering.settle(
                metered, outcome.usage, status=outcome.status, backend_id=outcome.backend_id, region=outcome.region,
                release=given_back,
            )

    return release


def _failure(exc: BaseException, metered: MeteredRequest, flights: list[Flight]) -> Outcome:
    """The outcome of a request that got no first byte: recorded against the backend that refused
    or failed it, when one did."""
    if isinstance(exc, BackendError) and flights and exc.endpoint_id is not None:
        status: UsageStatus = "rejected" if isinstance(exc, (BackendRejected, BackendOverloaded)) else "backend_error"
        region = next((e.region for f in flights for e in f.endpoints if e.id == exc.endpoint_id), None)
        return Outcome(Usage(metered.prompt_tokens, 0, 0), status, exc.endpoint_id, region)
    return Outcome(Usage(0, 0, 0), "cancelled")
