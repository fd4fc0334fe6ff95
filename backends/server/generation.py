"""Running one request through the engine: admission, the first output, the rest, and cleanup.

`GenerationService.start` admits the request, submits it and waits for its first output, so an
engine refusal (bad request, overload) surfaces as an HTTP status before any byte is sent.
The returned `Generation` is then streamed or collected; `close()` (always called, also on
disconnect or cancellation) aborts the request in the engine if it has not finished, releases
its admission slot and records its metrics, exactly once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.server.admission import Admission
from backends.server.errors import APIError, from_engine_error
from backends.server.metrics import BackendMetrics
from contracts.prefix_hash import adapter_salt
from engines.base import Engine, GenerationOutput, GenerationRequest
from engines.errors import EngineError
from engines.sampling_params import SamplingParams

if TYPE_CHECKING:
    from backends.server.region_service import RegionPoolService  # imports torch: only where the engine is ours

log = logging.getLogger("edgerun.backend")


@dataclass(slots=True)
class Completion:
    """A whole generation, collected (non-streaming answers)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generated_tokens: int


class Generation:
    """One admitted request's outputs. Iterate once (or `collect()`), then `close()`."""

    def __init__(
        self, service: GenerationService, route: str, request_id: str, outputs: AsyncIterator[GenerationOutput]
    ) -> None:
        self.route = route
        self.request_id = request_id
        self.last: GenerationOutput | None = None
        self._service = service
        self._outputs = outputs
        self._first: GenerationOutput | None = None
        self._started_at = time.monotonic()
        self._is_closed = False
        self._error_outcome: str | None = None  # set when the engine refused or failed the request
        self.on_finished: Callable[[], None] | None = None  # called once when it ends with outcome ok

    async def prime(self) -> None:
        """Wait for the first output; engine errors become APIErrors."""
        try:
            self._first = await anext(self._outputs)
        except StopAsyncIteration as exc:
            self._error_outcome = "error"
            raise APIError("the engine ended the request without any output") from exc
        except EngineError as exc:
            error = from_engine_error(exc)
            self._error_outcome = outcome_of(error)
            raise error from exc
        self._service.metrics.ttft.labels(self.route).observe(time.monotonic() - self._started_at)

    async def __aiter__(self) -> AsyncIterator[GenerationOutput]:
        assert self._first is not None, "prime() first"
        self.last = self._first
        yield self._first
        if self._first.is_finished:
            return
        try:
            async for output in self._outputs:
                self.last = output
                yield output
        except EngineError as exc:
            self._error_outcome = "error"
            raise from_engine_error(exc) from exc

    async def collect(self) -> Completion:
        text: list[str] = []
        token_ids: list[int] = []
        async for output in self:
            text.append(output.new_text)
            token_ids += output.new_token_ids
        last = self.last
        assert last is not None
        return Completion(
            text="".join(text),
            token_ids=token_ids,
            finish_reason=last.finish_reason,
            num_prompt_tokens=last.num_prompt_tokens,
            num_cached_tokens=last.num_cached_tokens,
            num_generated_tokens=last.num_generated_tokens,
        )

    @property
    def outcome(self) -> str:
        if self._error_outcome is not None:
            return self._error_outcome
        if self.last is None or not self.last.is_finished:
            return "cancelled"  # the client left (or the server stopped reading) mid-way
        return "aborted" if self.last.finish_reason == "abort" else "ok"

    async def close(self) -> None:
        """Abort in the engine if unfinished, free the admission slot, record metrics. Idempotent."""
        if self._is_closed:
            return
        self._is_closed = True
        try:
            await self._outputs.aclose()  # type: ignore[attr-defined]  # leaving early aborts the request
        finally:
            self._service.admission.release(self.request_id)
            metrics = self._service.metrics
            metrics.requests.labels(self.route, self.outcome).inc()
            elapsed_s = time.monotonic() - self._started_at
            metrics.latency.labels(self.route).observe(elapsed_s)
            if self.last is not None:
                metrics.observe_speculation(self.last)
            if self.on_finished is not None and self.outcome == "ok":
                self.on_finished()
            self._log(elapsed_s)

    def _log(self, elapsed_s: float) -> None:
        """One line per request, under the engine request id (the gateway's id inside it)."""
        last = self.last
        log.info(
            "request finished: request_id=%s route=%s outcome=%s prompt_tokens=%d cached_tokens=%d"
            " generated_tokens=%d ms=%.1f",
            self.request_id, self.route, self.outcome,
            last.num_prompt_tokens if last else 0, last.num_cached_tokens if last else 0,
            last.num_generated_tokens if last else 0, elapsed_s * 1e3,
        )


class GenerationService:
    def __init__(
        self, engine: Engine, admission: Admission, metrics: BackendMetrics, region: RegionPoolService | None = None,
    ) -> None:
        self.engine = engine
        self.admission = admission
        self.metrics = metrics
        self.region = region  # the region's shared KV pool: fetched from before, shared with after

    async def start(
        self,
        route: str,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        cache_salt: str | None,
        *,
        pin_kv: bool = False,
        submit: Callable[[GenerationRequest], AsyncIterator[GenerationOutput]] | None = None,
        may_queue: bool = True,
        lora: str | None = None,
    ) -> Generation:
        """Admit and submit the request and wait for its first output (raises APIError).

        `pin_kv`: a context step (its KV is pinned if it stops at its budget); `submit` replaces
        `engine.generate` (a generation step that imports its KV); `may_queue`: False refuses the
        request (429) unless it runs at once (admission.py); `lora`: the LoRA adapter it runs under (None: the base model)."""
        try:
            self.admission.admit(request_id, may_queue=may_queue)
        except APIError as exc:
            self.metrics.requests.labels(route, outcome_of(exc)).inc()
            raise
        pool_salt = adapter_salt(cache_salt, lora)  # a LoRA request's blocks are its adapter's (the engine's chain)
        if self.region is not None and submit is None:
            try:
                await self.region.fill(prompt_token_ids, pool_salt)
            except BaseException:  # cancelled (the client left) or the engine stopped: give the slot back
                self.admission.release(request_id)
                raise
        request = GenerationRequest(request_id, prompt_token_ids, sampling, cache_salt, pin_kv_on_finish=pin_kv, lora=lora)
        outputs = (submit or self.engine.generate)(request)
        generation = Generation(self, route, request_id, outputs)
        if self.region is not None:
            region = self.region
            generation.on_finished = lambda: region.share_later(prompt_token_ids, pool_salt)
        try:
            await generation.prime()
        except BaseException:
            await generation.close()
            raise
        return generation


def outcome_of(error: APIError) -> str:
    """The `outcome` label of a request that ended with `error`."""
    if error.status == 429:
        return "overloaded"
    if error.status == 503:
        return "unavailable"
    return "rejected" if error.status < 500 else "error"
