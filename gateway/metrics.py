"""The gateway's Prometheus metrics, on a registry of its own (one per app, so tests and several
apps in one process never share counters)."""

from __future__ import annotations

from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as _Counter
from prometheus_client import Gauge as _Gauge
from prometheus_client import Histogram as _Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
INTER_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5)


class _RememberedLabels:
    """`labels(*values)` remembered per value tuple: prometheus_client validates and converts the
    values and takes a lock on every call, and the gateway asks for the same few children on
    every request (route, status, model). Keyword labels go the uncached way."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._children: dict[tuple[Any, ...], Any] = {}

    def labels(self, *values: Any, **named: Any) -> Any:
        if named:
            return super().labels(*values, **named)  # type: ignore[misc]
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = super().labels(*values)  # type: ignore[misc]
        return child


class Counter(_RememberedLabels, _Counter):
    pass


class Gauge(_RememberedLabels, _Gauge):
    pass


class Histogram(_RememberedLabels, _Histogram):
    pass


class GatewayMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        counter = partial(Counter, registry=self.registry)
        gauge = partial(Gauge, registry=self.registry)
        histogram = partial(Histogram, registry=self.registry)
        self.requests = counter("edgerun_gateway_requests", "HTTP requests answered", ["route", "status", "model"])
        self.latency = histogram(
            "edgerun_gateway_request_seconds", "Time from request start to the last response byte", ["route", "model"],
            buckets=LATENCY_BUCKETS,
        )
        self.ttft = histogram(
            "edgerun_gateway_time_to_first_token_seconds",
            "Time from request start to the first generated text sent to the client",
            ["model"],
            buckets=LATENCY_BUCKETS,
        )
        self.inter_token = histogram(
            "edgerun_gateway_inter_token_seconds",
            "Mean gap between generated tokens of one streamed answer (first to last text), one per request",
            ["model"],
            buckets=INTER_TOKEN_BUCKETS,
        )
        self.errors = counter(
            "edgerun_gateway_errors",
            "Responses answered with an error envelope, by Workers AI code and HTTP status",
            ["code", "status"],
        )
        self.tokens = counter("edgerun_gateway_tokens", "Tokens by kind (prompt, completion)", ["model", "kind"])
        self.cached_tokens = counter(
            "edgerun_gateway_cached_tokens", "Prompt tokens served from a backend's prefix cache", ["model"]
        )
        self.routing_decisions = counter(
            "edgerun_gateway_routing_decisions", "Backends chosen, by policy", ["policy", "backend"]
        )
        self.failovers = counter(
            "edgerun_gateway_failovers", "Requests served by another backend than the one chosen", ["backend"]
        )
        self.backend_healthy = gauge(
            "edgerun_gateway_backend_healthy", "1 when the last health check passed", ["backend", "region"]
        )
        self.backend_breaker_state = gauge(
            "edgerun_gateway_backend_breaker_state",
            "Outlier ejection per backend: 0 closed (taking traffic), 1 half-open (on trial), 2 open (ejected)",
            ["backend"],
        )
        self.backend_ejections = counter(
            "edgerun_gateway_backend_ejections",
            "Times a backend was ejected after repeated failures (or a failed trial or probe)",
            ["backend"],
        )
        self.backend_in_flight = gauge(
            "edgerun_gateway_backend_in_flight_tokens", "In-flight tokens per backend (store view)", ["backend", "kind"]
        )
        self.disagg_steps = counter(
            "edgerun_gateway_disagg_steps",
            "Steps of disaggregated requests (context, generation, local prefill), by backend and outcome",
            ["step", "backend", "outcome"],
        )
        self.disagg_context_seconds = histogram(
            "edgerun_gateway_disagg_context_seconds", "Time of a disaggregated request's context step"
        )
        self.kv_event_batches = counter(
            "edgerun_gateway_kv_event_batches", "KV event batches received over ZMQ from vLLM or SGLang backends",
            ["backend"],
        )
        self.kv_event_resets = counter(
            "edgerun_gateway_kv_event_resets",
            "Times a backend's KV event stream lost messages for good or restarted (its index entries cleared)",
            ["backend"],
        )
        self.kv_blocks_skipped = gauge(
            "edgerun_gateway_kv_blocks_skipped",
            "Engine blocks from KV events not put in the prefix index, by reason (unsalted, orphan, foreign)",
            ["backend", "reason"],
        )
        self.cached_tokens_unknown = counter(
            "edgerun_gateway_cached_tokens_unknown",
            "Completed requests whose backend reported no prompt_tokens_details.cached_tokens (billed uncached)",
            ["backend"],
        )
        self.usage_records = counter(
            "edgerun_gateway_usage_records", "Usage records written to the ledger, by outcome", ["outcome"]
        )
        self.response_cache = counter(
            "edgerun_gateway_response_cache",
            "Requests that asked the response cache, by result (hit, miss), and answers kept or not (kept, too_large)",
            ["model", "result"],
        )

        self.batch_items = gauge(
            "edgerun_gateway_batch_items",
            "Batch items not answered yet, every tenant's, by state (queued, running), read every few seconds",
            ["state"],
        )
        self.batch_item_runs = counter(
            "edgerun_gateway_batch_item_runs",
            "Batch items this process ran, by outcome: ok, error (answered with an error), given_back (no spare"
            " capacity: later), duplicate (another worker's answer came first), interrupted (runs again later)",
            ["outcome"],
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
