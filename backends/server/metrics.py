"""Prometheus metrics of one backend, in a registry owned by its app (never the global one).

Load and cache figures are read from the engine's stats snapshot at scrape time (a collector),
so they cost nothing between scrapes; request counts and latencies are recorded as requests end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engines.base import EngineStats, GenerationOutput, KVTierCounters

PREFIX = "edgerun_backend"
ACCEPTANCE_RATE_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
ACCEPTED_LENGTH_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0)
KV_TRANSFER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)  # region pool fetch, KV pull
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class _EngineCollector(Collector):
    def __init__(
        self, stats: Callable[[], EngineStats | None], labels: dict[str, str],
        region_tier: Callable[[], KVTierCounters | None],
    ) -> None:
        self._stats = stats
        self._labels = labels
        self._region_tier = region_tier

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:  # engine not loaded yet
            return
        names, values = list(self._labels), list(self._labels.values())

        def series(kind: type[GaugeMetricFamily | CounterMetricFamily], name: str, doc: str, value: float) -> Metric:
            family = kind(f"{PREFIX}_{name}", doc, labels=names)
            family.add_metric(values, value)
            return family

        gauge, counter = partial(series, GaugeMetricFamily), partial(series, CounterMetricFamily)

        yield gauge("requests_running", "Requests in the engine's running batch.", stats.num_running)
        yield gauge("requests_waiting", "Requests queued in the engine, not yet running.", stats.num_waiting)
        yield gauge(
            "prefill_tokens_inflight", "Prompt tokens admitted but not yet prefilled.", stats.num_prefill_tokens
        )
        yield gauge("decode_tokens_inflight", "Tokens still to generate for running requests.", stats.num_decode_tokens)
        yield gauge("kv_blocks_total", "KV cache capacity in blocks.", stats.num_kv_blocks_total)
        yield gauge("kv_blocks_free", "KV cache blocks free.", stats.num_kv_blocks_free)
        yield gauge(
            "kv_blocks_used", "KV cache blocks in use.", stats.num_kv_blocks_total - stats.num_kv_blocks_free
        )
        yield gauge("kv_blocks_pinned", "KV blocks pinned for decode backends to pull.", stats.num_kv_blocks_pinned)
        yield counter(
            "prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache.", stats.num_prefix_hit_tokens
        )
        yield counter("prompt_tokens", "Prompt tokens received.", stats.num_prompt_tokens)
        yield counter("generation_tokens", "Tokens generated.", stats.num_generated_tokens)
        yield counter("spec_draft_tokens", "Speculative draft tokens verified.", stats.num_draft_tokens)
        yield counter(
            "spec_accepted_tokens", "Speculative draft tokens the target accepted.", stats.num_accepted_draft_tokens
        )
        tiers = {"host": stats.host_tier, "region": self._region_tier()}
        yield from _tier_families([(tier, c) for tier, c in tiers.items() if c is not None], self._labels)


_TIER_SERIES = (  # (name, help, field, is a counter)
    ("kv_tier_capacity_blocks", "Blocks the tier may hold (0: the pool's own bound).", "capacity_blocks", False),
    ("kv_tier_blocks", "Blocks the tier holds now (host tier).", "num_blocks", False),
    ("kv_tier_hit_blocks", "Prompt blocks found in the tier and reused instead of prefilled.", "num_hit_blocks", True),
    ("kv_tier_miss_blocks", "Prompt blocks past the nearer tiers' hits that the tier lacked.", "num_miss_blocks", True),
    ("kv_tier_stored_blocks", "Blocks put into the tier.", "num_stored_blocks", True),
    ("kv_tier_evicted_blocks", "Blocks the tier dropped to stay within its size.", "num_evicted_blocks", True),
    ("kv_tier_bytes_in", "Bytes moved into the tier.", "num_bytes_in", True),
    ("kv_tier_bytes_out", "Bytes moved out of the tier (back into the KV pool).", "num_bytes_out", True),
    ("kv_tier_seconds", "Seconds spent copying to and from the tier (region: fetching).", "seconds", True),
)


def _tier_families(tiers: list[tuple[str, KVTierCounters]], labels: dict[str, str]) -> Iterator[Metric]:
    if not tiers:
        return
    names = [*labels, "tier"]
    for name, doc, attr, is_counter in _TIER_SERIES:
        family_type = CounterMetricFamily if is_counter else GaugeMetricFamily
        family = family_type(f"{PREFIX}_{name}", doc, labels=names)
        for tier, c in tiers:
            family.add_metric([*labels.values(), tier], getattr(c, attr))
        yield family


class BackendMetrics:
    """The backend's registry plus the request-level series it records itself."""

    def __init__(self, stats: Callable[[], EngineStats | None], *, model: str, region: str, role: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model": model, "region": region, "role": role}
        self.region_tier: KVTierCounters | None = None  # set by region_service.py where a regional pool is used
        self.registry.register(_EngineCollector(stats, labels, lambda: self.region_tier))
        counter = partial(Counter, registry=self.registry)
        histogram = partial(Histogram, registry=self.registry)
        self.requests = counter(f"{PREFIX}_requests", "Requests answered, by route and outcome.", ["route", "outcome"])
        self.latency = histogram(
            f"{PREFIX}_request_latency_seconds", "Time from admission to the last token.", ["route"],
            buckets=LATENCY_BUCKETS,
        )
        self.ttft = histogram(
            f"{PREFIX}_time_to_first_token_seconds", "Time from admission to the first generated token.", ["route"],
            buckets=LATENCY_BUCKETS,
        )
        # events the KV event ring dropped before every consumer had read them (kv_feed.py)
        self.kv_events_dropped = counter(
            f"{PREFIX}_kv_events_dropped",
            "KV cache events dropped from the full event ring before every consumer had read them.",
        )
        # a regional KV pool (region_service.py)
        self.kv_region_fetch_seconds = histogram(
            f"{PREFIX}_kv_region_fetch_seconds", "Time to look up and fetch a prompt's blocks from the region's pool.",
            buckets=KV_TRANSFER_BUCKETS,
        )
        self.kv_region_pool_errors = counter(
            f"{PREFIX}_kv_region_pool_errors", "Calls to the region's KV pool that failed or timed out."
        )
        # disaggregated serving (kv_service.py): pins nobody pulled in time, pulls and their cost
        self.kv_pins_expired = counter(
            f"{PREFIX}_kv_pins_expired",
            "Pinned context-step KV released because no decode backend pulled it within kv_pin_ttl_s.",
        )
        self.kv_pulls = counter(
            f"{PREFIX}_kv_pulls", "KV pulls of generation steps, by transport and outcome.", ["transport", "outcome"]
        )
        self.kv_pull_seconds = histogram(
            f"{PREFIX}_kv_pull_seconds", "Time to pull a request's KV blocks.", ["transport"],
            buckets=KV_TRANSFER_BUCKETS,
        )
        self.kv_pull_bytes = counter(f"{PREFIX}_kv_pull_bytes", "KV bytes pulled by generation steps.", ["transport"])
        # speculative decoding, one observation per finished request that verified drafts
        self.spec_acceptance_rate = histogram(
            f"{PREFIX}_spec_acceptance_rate",
            "Per request: drafted tokens the target accepted / drafted tokens verified.",
            buckets=ACCEPTANCE_RATE_BUCKETS,
        )
        self.spec_accepted_length = histogram(
            f"{PREFIX}_spec_mean_accepted_length",
            "Per request: mean tokens emitted per verify step (accepted drafts + the target's own token).",
            buckets=ACCEPTED_LENGTH_BUCKETS,
        )

    def observe_speculation(self, last: GenerationOutput) -> None:
        """Record a finished request's acceptance, if it verified any drafts."""
        if last.num_verify_steps and last.num_draft_tokens:
            self.spec_acceptance_rate.observe(last.num_accepted_draft_tokens / last.num_draft_tokens)
            self.spec_accepted_length.observe(1 + last.num_accepted_draft_tokens / last.num_verify_steps)

    def render(self) -> bytes:
        return generate_latest(self.registry)
