"""Disaggregated prefill/decode: the two-step flow of trtllm-serve's disaggregated server.

A model whose backends include `prefill` (context) or `decode` (generation) roles is served in
two steps. The decode backend is chosen first, by the cache-aware policy over the decode pool
(decode and mixed backends: its load and its own prefix hits). If what it lacks of the prompt is
at most `max_local_prefill_length` tokens, or no prefill backend is healthy, it prefills locally:
an ordinary request (TensorRT-LLM's conditional disaggregation). Otherwise:

1. context step: the request, non-streamed, with `disaggregated_params: {request_type:
   context_only}`, to a prefill backend picked by the cache-aware policy over the prefill pool
   (prefix hits matter most there), failing over to the next one;
2. an answer that is already final (EOS, a stop string, one token) is the whole answer;
3. generation step: the request again, its prompt replaced by the context step's
   prompt_token_ids and its disaggregated_params copied with `request_type: generation_only`,
   streamed from the decode backend, failing over to the next decode backend before the first
   byte (it pulls the same pinned KV). If every decode backend fails, the context backend may
   have died: the context step runs again on the next prefill backend; if the pin expired before
   the pull (410), it runs again on the same one, once.

Billing stays the caller's: one usage record per client request, whose prompt and cached tokens
are the context step's (where the prompt was prefilled) and whose completion tokens are the
generation step's (it counts the first token). Both steps are logged and counted under the
request id.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from backends.client import (
    BackendClient,
    BackendError,
    BackendOverloaded,
    BackendRejected,
    BackendTimeout,
    BackendUnavailable,
    CompletionChunk,
    ContextAnswer,
    Endpoint,
)
from contracts.usage import Usage
from gateway.context import RequestContext
from gateway.fleet.monitor import BackendMonitor
from gateway.metrics import GatewayMetrics
from gateway.pipeline.routing import Flight, Router

log = structlog.get_logger("edgerun.gateway.disagg")

RouteFn = Callable[[list[Endpoint], int], Awaitable[Flight]]  # (pool, max_tokens) -> a counted flight
KV_GONE_STATUS = 410  # our backends' answer when the pinned KV expired or was pulled already
KV_GONE_RETRIES = 1  # context steps run again on the same prefill backend after a 410


@dataclass(frozen=True, slots=True)
class Pools:
    prefill: list[Endpoint]
    decode: list[Endpoint]  # decode and mixed backends

    @classmethod
    def of(cls, endpoints: list[Endpoint]) -> Pools | None:
        """The pools of a disaggregated deployment; None when every backend is mixed."""
        if all(e.role == "mixed" for e in endpoints):
            return None
        return cls([e for e in endpoints if e.role == "prefill"], [e for e in endpoints if e.role != "prefill"])


@dataclass(slots=True)
class Attempt:
    """What one request routed so far: every flight must be finished however the request ends."""

    flights: list[Flight] = field(default_factory=list)
    failed: list[BackendError] = field(default_factory=list)  # what backends answered before a first byte
    reject_if_busy: bool = False  # options.rejectIfBusy: backends refuse it (429) rather than queue it

    def on_failure(self, record: Callable[[BackendError], None]) -> Callable[[BackendError], None]:
        """The client's failover hook: keeps each error here (the endpoints failed over) and passes it on."""

        def hear(exc: BackendError) -> None:
            self.failed.append(exc)
            record(exc)

        return hear


@dataclass(slots=True)
class Opened:
    flight: Flight  # the flight of the backend that streams to the client
    endpoint: Endpoint
    chunks: AsyncGenerator[list[CompletionChunk], None]  # a batch per read (BackendClient.stream_with_failover)
    disaggregated: bool


@dataclass(eq=False)
class Disaggregator:
    router: Router
    client: BackendClient
    monitor: BackendMonitor
    metrics: GatewayMetrics
    max_local_prefill_length: int

    async def open(
        self,
        ctx: RequestContext,
        attempt: Attempt,
        route: RouteFn,
        pools: Pools,
        body: dict[str, Any],
        max_tokens: int,
    ) -> Opened:
        """Run the flow above; raises the last BackendError when no path produced a first byte."""
        if not pools.decode:
            raise BackendUnavailable("no decode or mixed backend serves this model: a prefill pool alone cannot decode")
        decode = await route(pools.decode, max_tokens)
        attempt.flights.append(decode)
        uncached = decode.info.num_prompt_tokens - decode.expected_cached_tokens
        has_prefill = any(self.monitor.is_healthy(e.id) for e in pools.prefill)
        if uncached <= self.max_local_prefill_length or not has_prefill:
            reason = "short" if has_prefill else "no_prefill_backend"
            log.info("prefilling locally", request_id=ctx.request_id, uncached=uncached, reason=reason)
            endpoint, chunks = await self._stream(attempt, decode, body, "local")
            return Opened(decode, endpoint, chunks, disaggregated=False)
        prefill = await route(pools.prefill, 1)
        attempt.flights.append(prefill)
        failures: list[BackendError] = []
        for context_endpoint in prefill.endpoints:
            for _ in range(1 + KV_GONE_RETRIES):
                try:
                    answer = await self._context(context_endpoint, body, ctx, attempt.reject_if_busy)
                except (BackendUnavailable, BackendTimeout, BackendOverloaded) as exc:
                    failures.append(exc)
                    break  # the next prefill backend
                await self.router.started(prefill, context_endpoint)
                await self.router.finished(prefill, success=True)
                await self.router.first_token(decode)  # the decode backend imports the prompt: no prefill there
                if not answer.needs_generation(max_tokens):
                    return Opened(prefill, context_endpoint, _answer_chunks(answer), disaggregated=True)
                try:
                    gen_body = generation_body(body, answer)
                    endpoint, chunks = await self._stream(attempt, decode, gen_body, "generation")
                except BackendRejected as exc:
                    if exc.status != KV_GONE_STATUS:
                        raise
                    failures.append(exc)
                    continue  # the KV expired before any decode backend pulled it: prefill again
                except BackendOverloaded:
                    raise  # every decode backend is full: prefilling again elsewhere would not help
                except (BackendUnavailable, BackendTimeout) as exc:
                    failures.append(exc)
                    break  # maybe the context backend is gone: prefill on the next one
                return Opened(decode, endpoint, with_context_usage(chunks, answer.usage), disaggregated=True)
        if not failures:
            raise BackendUnavailable("no prefill backend to try")
        raise failures[-1]

    async def _context(
        self, endpoint: Endpoint, body: dict[str, Any], ctx: RequestContext, reject_if_busy: bool
    ) -> ContextAnswer:
        started = time.perf_counter()
        try:
            answer = await self.client.context(endpoint, body, ctx.request_id, reject_if_busy=reject_if_busy)
        except BackendError as exc:
            self.metrics.disagg_steps.labels("context", endpoint.id, "error").inc()
            log.warning("context step failed", request_id=ctx.request_id, backend=endpoint.id, error=exc.message)
            self.monitor.record_error(exc, ctx.tenant_id)
            if isinstance(exc, BackendUnavailable) and not exc.answered:  # a failed answer: maybe the request's fault
                self.monitor.mark_unhealthy(endpoint.id, "failed a context step")
            raise
        elapsed = time.perf_counter() - started
        self.metrics.disagg_steps.labels("context", endpoint.id, "ok").inc()
        self.monitor.record_success(endpoint.id)  # a prefill backend's failures count in a row only
        self.metrics.disagg_context_seconds.observe(elapsed)
        log.info(
            "context step", request_id=ctx.request_id, backend=endpoint.id, ms=round(elapsed * 1e3, 1),
            cached=answer.usage.cached_tokens, prompt=answer.usage.prompt_tokens, finish=answer.finish_reason,
        )
        return answer

    async def _stream(
        self, attempt: Attempt, flight: Flight, body: dict[str, Any], step: str
    ) -> tuple[Endpoint, AsyncGenerator[list[CompletionChunk], None]]:
        ctx = flight.ctx
        try:
            endpoint, chunks = await self.client.stream_with_failover(
                flight.endpoints, body, attempt.on_failure(self.monitor.errors_of(ctx.tenant_id, ctx.request_id)),
                ctx.request_id, reject_if_busy=attempt.reject_if_busy, adapter=ctx.adapter,
            )
        except BackendError as exc:
            self.metrics.disagg_steps.labels(step, exc.endpoint_id or "", "error").inc()
            log.warning(f"{step} step failed", request_id=ctx.request_id, error=exc.message)
            raise
        self.metrics.disagg_steps.labels(step, endpoint.id, "ok").inc()
        log.info(f"{step} step streaming", request_id=ctx.request_id, backend=endpoint.id)
        return endpoint, chunks


def generation_body(body: dict[str, Any], answer: ContextAnswer) -> dict[str, Any]:
    """The generation step's request: the original, with the context step's tokens and params."""
    assert answer.disaggregated_params is not None
    params = {**answer.disaggregated_params, "request_type": "generation_only"}
    prompt = answer.prompt_token_ids if answer.prompt_token_ids is not None else body["prompt"]
    return {**body, "prompt": prompt, "disaggregated_params": params}


async def with_context_usage(
    chunks: AsyncGenerator[list[CompletionChunk], None], context: Usage
) -> AsyncGenerator[list[CompletionChunk], None]:
    """The generation step's chunks, their usage's prompt and cached tokens the context step's."""
    try:
        async for batch in chunks:
            for chunk in batch:
                if chunk.usage is not None:
                    chunk.usage = Usage(
                        context.prompt_tokens or chunk.usage.prompt_tokens, chunk.usage.completion_tokens,
                        context.cached_tokens,
                    )
            yield batch
    finally:
        await chunks.aclose()


async def _answer_chunks(answer: ContextAnswer) -> AsyncGenerator[list[CompletionChunk], None]:
    """A final context answer as the one chunk of a stream."""
    yield [CompletionChunk(answer.text, answer.token_ids, answer.finish_reason, answer.usage)]
