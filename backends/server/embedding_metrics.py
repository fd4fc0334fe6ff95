"""Prometheus metrics of an embedding backend, read from its batcher at scrape time.

    edgerun_backend_embedding_queued_tokens     gauge    input tokens waiting to be encoded
    edgerun_backend_embedding_queued_tenants    gauge    tenants with texts waiting
    edgerun_backend_embedding_passes_total      counter  forward passes run
    edgerun_backend_embedding_texts_total       counter  texts by outcome: encoded, dropped (the caller left first)
    edgerun_backend_embedding_refused_total     counter  requests the queue's bounds refused (429 / 400)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.server.metrics import PREFIX
from engines.embedding.batcher import EmbeddingBatcher

NAME = f"{PREFIX}_embedding"


class _BatcherCollector(Collector):
    def __init__(self, batcher: Callable[[], EmbeddingBatcher | None]) -> None:
        self._batcher = batcher

    def collect(self) -> Iterator[Metric]:
        batcher = self._batcher()
        if batcher is None:  # the encoder is still loading
            return
        queue, stats = batcher.queue, batcher.stats
        yield GaugeMetricFamily(f"{NAME}_queued_tokens", "Input tokens waiting to be encoded.", queue.num_waiting_tokens)
        yield GaugeMetricFamily(f"{NAME}_queued_tenants", "Tenants with texts waiting.", queue.num_tenants)
        yield CounterMetricFamily(f"{NAME}_passes", "Forward passes run.", stats.num_passes)
        texts = CounterMetricFamily(f"{NAME}_texts", "Texts by outcome.", labels=["outcome"])
        texts.add_metric(["encoded"], stats.num_texts_encoded)
        texts.add_metric(["dropped"], stats.num_texts_dropped)
        yield texts
        yield CounterMetricFamily(f"{NAME}_refused", "Requests the queue's bounds refused.", stats.num_refused)


class EmbeddingMetrics:
    def __init__(self, batcher: Callable[[], EmbeddingBatcher | None]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_BatcherCollector(batcher))

    def render(self) -> bytes:
        return generate_latest(self.registry)
