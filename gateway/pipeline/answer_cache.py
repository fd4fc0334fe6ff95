"""The opt-in exact response cache, with AI Gateway's per-request semantics.

Off unless a request asks (http/client_headers.py reads the headers into a `CacheDirective`):

- `cf-aig-cache-ttl: N` (seconds): serve this request from the cache when an identical request's
  answer is there, else answer it and keep the answer for N seconds. As AI Gateway documents, N is
  at least 60 and at most one month (`MIN_TTL_S`, `MAX_TTL_S`: values outside are brought inside).
- `cf-aig-cache-key: K`: the entry is named K instead of the request's hash (any request of the
  tenant with the same K is served K's answer, whatever its body); kept for the TTL above, else 5
  minutes (`DEFAULT_TTL_S`, AI Gateway's default when its gateway-wide cache is off).
- `cf-aig-skip-cache: true`: never served from the cache; with a TTL, its fresh answer replaces the
  entry. The old names `cf-cache-ttl` and `cf-skip-cache` still work, as on AI Gateway.
- Every answer to such a request says `cf-aig-cache-status: HIT` or `MISS`.

Text generation on `/ai/run`, `/ai/v1/chat/completions` and `/ai/v1/completions` is cached; the
Responses route and embeddings are not (they ignore the headers and answer no status).

What makes two requests identical (`cache_key`): the tenant (every entry is the tenant's own: a
different key of the same tenant hits, another tenant never does; AI Gateway keys by the provider
credential, edgerun by the tenant, who owns and pays for every key), the route (`run`, `chat`,
`completions`: AI Gateway's endpoint), the model id (after aliases), and the parsed request: the
prompt or messages, tools, JSON schema and every sampling field, each with its default filled in, so
a field left out and the same field sent with its default value are the same request. What only
changes the encoding or the waiting is left out: `stream`, `stream_options`, `options.rejectIfBusy`.

A request with `temperature` > 0 and no `seed` is cached like any other, as AI Gateway does: the
client that asks for the cache accepts one sampled answer for the TTL (send `cf-aig-skip-cache` or
no cache header for a fresh sample).

Only complete answers are kept: the backend's stream ended normally with a finish reason (`length`
included). Errors, broken streams and requests whose client left (`cancelled`) are not, nor an
answer over `cache_max_entry_bytes`. A hit runs no backend and costs nothing: its ledger record has
status `cached`, 0 tokens and cost 0 (billing/rules.py), and it takes none of the tenant's
concurrency slots, tokens per minute or budget (it was counted against requests per minute on
arrival, as every request is). The store is best effort here: a cache it cannot reach is a miss
and an answer it cannot keep is not kept, logged, never failing the request.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Literal

import structlog

from contracts.usage import Usage
from gateway.billing.metering import MeteredRequest, Metering
from gateway.context import RequestContext
from gateway.pipeline.generation import Generation, Generator
from gateway.pipeline.replay import Answer, CachedAnswer, Replay
from gateway.pipeline.schemas import GenerationInput
from gateway.store.cache import Cache
from gateway.store.errors import StoreUnavailable

log = structlog.get_logger("edgerun.gateway.answer_cache")

MIN_TTL_S = 60
MAX_TTL_S = 30 * 86_400  # one month
DEFAULT_TTL_S = 300
CACHE_STATUS_HEADER = "cf-aig-cache-status"
Route = Literal["run", "chat", "completions"]
CacheStatus = Literal["HIT", "MISS"]


@dataclass(frozen=True, slots=True)
class CacheDirective:
    """What a request asked of the cache."""

    ttl_s: int | None  # cf-aig-cache-ttl, brought within [MIN_TTL_S, MAX_TTL_S]; None: not sent
    skip: bool = False  # cf-aig-skip-cache: true
    key: str | None = None  # cf-aig-cache-key

    @property
    def keep_s(self) -> int | None:
        """How long to keep this request's answer (None: not at all)."""
        if self.ttl_s is not None:
            return self.ttl_s
        return DEFAULT_TTL_S if self.key is not None else None

    @property
    def may_read(self) -> bool:
        return not self.skip and self.keep_s is not None


def clamp_ttl(seconds: int) -> int:
    return min(MAX_TTL_S, max(MIN_TTL_S, seconds))


def cache_key(
    route: Route, model_id: str, inp: GenerationInput, custom_key: str | None = None, adapter: str | None = None
) -> str:
    """The entry's name within its tenant: a SHA-256 of what makes two requests identical; `adapter` (the
    finetune id the request runs under) keeps a finetune's answers apart from its base model's and others'."""
    if custom_key is not None:
        material: list[object] = ["key", custom_key]
    else:
        fields = asdict(inp)
        for encoding_only in ("stream", "include_usage", "reject_if_busy"):
            del fields[encoding_only]
        del fields["lora"]  # the name as sent: the finetune's id below is what ran
        material = ["request", route, model_id, fields]
    if adapter is not None:
        material.append(["lora", adapter])
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Started:
    """An answer on its way: live, or from the cache; and what `cf-aig-cache-status` says (None: not asked)."""

    answer: Answer
    cache_status: CacheStatus | None = None

    @property
    def backend_id(self) -> str | None:
        return self.answer.endpoint.id if isinstance(self.answer, Generation) else None


class AnswerCache:
    """`Generator.start` behind the response cache."""

    def __init__(self, cache: Cache, generator: Generator, metering: Metering) -> None:
        self.cache = cache
        self.generator = generator
        self.metering = metering

    async def start(
        self, ctx: RequestContext, inp: GenerationInput, route: Route, directive: CacheDirective | None
    ) -> Started:
        """The cached answer when the request may read one and it is there (recorded `cached`), else
        the generation, whose complete answer is kept when the request asked for it."""
        if directive is None:
            return Started(await self.generator.start(ctx, inp))
        key = cache_key(route, ctx.model_id, inp, directive.key, ctx.adapter)
        counted = self.metering.metrics.response_cache
        if directive.may_read:
            found = await self._get(ctx, key)
            if found is not None:
                counted.labels(ctx.model_id, "hit").inc()
                await self.metering.settle(MeteredRequest(ctx, prompt_tokens=0), Usage(0, 0, 0), status="cached",
                                           backend_id=None, region=None)
                return Started(Replay(ctx, found), "HIT")
        counted.labels(ctx.model_id, "miss").inc()
        generation = await self.generator.start(ctx, inp)
        keep_s = directive.keep_s
        if keep_s is not None:
            generation.on_complete = lambda done: self._keep(done, key, keep_s)
        return Started(generation, "MISS")

    async def _get(self, ctx: RequestContext, key: str) -> CachedAnswer | None:
        try:
            text = await self.cache.get(ctx.tenant_id, key)
        except StoreUnavailable as exc:
            log.warning("the response cache is unavailable: a miss", error=exc.args[0], request_id=ctx.request_id)
            return None
        return None if text is None else CachedAnswer.from_json(text)

    async def _keep(self, generation: Generation, key: str, ttl_s: int) -> None:
        """Keep a generation that completed (its stream ended normally, with a finish reason)."""
        if generation.finish_reason is None or generation.usage is None:
            return
        answer = CachedAnswer(generation.deltas, generation.finish_reason, generation.usage)
        ctx = generation.ctx
        try:
            kept = await self.cache.put(ctx.tenant_id, key, answer.to_json(), ttl_s)
        except StoreUnavailable as exc:
            log.warning("keeping the answer failed", error=exc.args[0], request_id=ctx.request_id)
            return
        self.metering.metrics.response_cache.labels(ctx.model_id, "kept" if kept else "too_large").inc()
        if not kept:
            log.info("the answer is over cache_max_entry_bytes: not kept", request_id=ctx.request_id)
