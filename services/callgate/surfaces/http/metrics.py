"""``/metrics``: Prometheus figures, computed from the service's own state at scrape time.

- ``callgate_decisions{code,tool}``: invocations whose current outcome is ``code`` (the
  status view, tallied by one query on embedded; a gauge, since an ``outcome_uncertain``
  call can still become ``executed``);
- ``callgate_decision_latency_seconds{tool}``: from publishing a proposal to its settled
  answer, as the API observed it (a histogram);
- ``callgate_pending_approvals{tool}``: the pending view;
- ``callgate_consumer_lag{process}``: input records a process has not processed yet;
- ``callgate_dead_letters``: records dead-lettered by the runners.

One registry per server (no module-level state), so tests can start several.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class PendingSource(Protocol):
    """The pending view and a version number that moves whenever it changes."""

    @property
    def version(self) -> int: ...

    def rows(self) -> list[dict[str, object]]: ...


class ServiceStats(Protocol):
    """Backend figures for /metrics and /readyz that no view holds."""

    def consumer_lag(self) -> dict[str, int]:
        """Per process: input records not yet processed."""
        ...

    def decisions(self) -> dict[tuple[str, str], int]:
        """Invocations per (current outcome code, tool)."""
        ...

    def dead_letters(self) -> int: ...

    def not_ready(self) -> str | None:
        """Why the service cannot answer yet, or None when it can."""
        ...


class StateCollector(Collector):
    def __init__(self, feed: PendingSource, stats: ServiceStats) -> None:
        self._feed = feed
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        decisions = GaugeMetricFamily(
            "callgate_decisions",
            "Invocations by their current outcome code and tool.",
            labels=["code", "tool"],
        )
        for (code, tool), n in sorted(self._stats.decisions().items()):
            decisions.add_metric([code, tool], n)
        yield decisions

        pending = GaugeMetricFamily(
            "callgate_pending_approvals", "Approvals waiting for a human.", labels=["tool"]
        )
        for tool, n in sorted(Counter(str(r.get("tool")) for r in self._feed.rows()).items()):
            pending.add_metric([tool], n)
        yield pending

        lag = GaugeMetricFamily(
            "callgate_consumer_lag", "Input records not yet processed.", labels=["process"]
        )
        for process, n in sorted(self._stats.consumer_lag().items()):
            lag.add_metric([process], n)
        yield lag

        yield GaugeMetricFamily(
            "callgate_dead_letters", "Records dead-lettered.", value=self._stats.dead_letters()
        )


class ApiMetrics:
    def __init__(self, feed: PendingSource, stats: ServiceStats) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.latency = Histogram(
            "callgate_decision_latency_seconds",
            "From publishing a proposal to its settled answer, seen by the API.",
            labelnames=["tool"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(StateCollector(feed, stats))
