"""The cluster's /metrics: every replica's series (vLLM's names) with a `replica` label, plus the
ingress's own counters.

Replicas push their Prometheus text to a small board actor (`MetricsBoard`, one per application,
owned by the ingress) every second; the ingress merges what the board holds from replicas heard
from in the last `STALE_AFTER` seconds, so a dead replica's series leave the page (Prometheus
treats the replacement's counters as a new series). `merge` is plain Python, tested without Ray.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

STALE_AFTER = 15.0  # seconds without a push before a replica's series are dropped


def merge(texts: dict[str, str], label: str = "replica") -> list:
    """One metric family per name, each sample carrying `label`=<replica tag>."""
    families: dict[str, object] = {}
    for tag in sorted(texts):
        for family in text_string_to_metric_families(texts[tag]):
            into = families.get(family.name)
            if into is None:
                into = families[family.name] = family
                samples, family.samples = family.samples, []
            else:
                samples = family.samples
            for s in samples:
                into.samples.append(type(s)(s.name, {**s.labels, label: tag}, s.value, s.timestamp, s.exemplar))
    return list(families.values())


class _Merged:
    """A prometheus_client collector over the board's texts (read at scrape time)."""

    def __init__(self, read) -> None:
        self.read = read

    def collect(self):
        return merge(self.read())


class ClusterMetrics:
    """The ingress's registry: merged replica series and the ingress's own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self._texts: dict[str, str] = {}
        self.registry.register(_Merged(lambda: self._texts))
        self.retried = Counter("verispec:cluster_retried_requests", "Requests re-sent to another replica after theirs "
                               "failed before sending anything.", registry=r)
        self.stream_errors = Counter("verispec:cluster_stream_errors", "Streams ended with an error event because "
                                     "their replica failed mid-stream.", registry=r)
        self.replicas = Gauge("verispec:cluster_replicas_reporting", "Replicas whose metrics reached the ingress "
                              f"in the last {STALE_AFTER:.0f} s.", registry=r)

    def render(self, replica_texts: dict[str, str]) -> bytes:
        self._texts = replica_texts
        self.replicas.set(len(replica_texts))
        return generate_latest(self.registry)


class MetricsBoard:
    """replica tag -> (Prometheus text, time pushed). A Ray actor in the cluster."""

    def __init__(self) -> None:
        self.texts: dict[str, tuple[str, float]] = {}

    def put(self, tag: str, text: str, at: float) -> None:
        self.texts[tag] = (text, at)

    def fresh(self, max_age: float = STALE_AFTER) -> dict[str, str]:
        now = time.time()
        for tag in [t for t, (_, at) in self.texts.items() if now - at > 4 * max_age]:
            del self.texts[tag]  # long gone
        return {tag: text for tag, (text, at) in self.texts.items() if now - at <= max_age}
