"""``/metrics``: Prometheus figures, computed from the service's own state at scrape time.

- ``callgate_decisions{code,tool}``: invocations whose current outcome is ``code`` (the
  status view, tallied by one query on embedded; a gauge, since an ``outcome_uncertain``
  call can still become ``executed``);
- ``callgate_decision_latency_seconds{tool}``: from publishing a proposal to its settled
  answer, as the API observed it (a histogram);
- ``callgate_outcome_latency_seconds{tool,outcome}``: from a proposal made through the API
  to its final outcome (executed, refused, denied, expired...: ``Gateway.is_final``), by
  the status view's time of that outcome; a call held for approval is observed at the
  first scrape after it ended (a histogram);
- ``callgate_pending_approvals{tool}``: the pending view;
- ``callgate_pending_age_seconds{tool}``: how long the oldest pending approval has waited;
- ``callgate_approval_wait_seconds{tool,result}``: from an approval's request to its leaving
  the pending view (granted, denied, expired; seen by this server's feed, to 0.2 s);
- ``callgate_provider_call_seconds{provider,operation}`` and
  ``callgate_provider_errors_total{provider,operation,error}``: provider latency and
  errors of the executor in this process (``callgate.providers.metrics``);
- ``callgate_consumer_lag{process}``: input records a process has not processed yet;
- ``callgate_dead_letters``: records dead-lettered by the runners;
- ``callgate_worker_stalls_total{process}``: workers on Kafka ended by their watchdog, a
  blocking client call past its bound, and restarted (docs/contract.md, "Kafka client
  errors");
- ``callgate_shadow_decisions_differed``: ``ShadowDecisionDiffered`` events (embedded).

One registry per server (no module-level state), so tests can start several.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

APPROVAL_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
OUTCOME_BUCKETS = (*LATENCY_BUCKETS, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)
# Invocations proposed through the API not final yet, whose outcome latency is still to
# be observed (bounded: the oldest are given up on first).
OPEN_KEPT = 10_000


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

    def stalls(self) -> dict[str, int]:
        """Per process: times it stopped making progress and was restarted."""
        ...

    def shadow_differed(self) -> int | None:
        """``ShadowDecisionDiffered`` events on the log (None: not counted here)."""
        ...

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
        rows = self._feed.rows()
        for tool, n in sorted(Counter(str(r.get("tool")) for r in rows).items()):
            pending.add_metric([tool], n)
        yield pending

        age = GaugeMetricFamily(
            "callgate_pending_age_seconds",
            "Age of the oldest approval still waiting, by tool.",
            labels=["tool"],
        )
        oldest: dict[str, int] = {}
        for r in rows:
            at = r.get("requested_at")
            if isinstance(at, int):
                tool = str(r.get("tool"))
                oldest[tool] = min(oldest.get(tool, at), at)
        now_ms = time.time() * 1000
        for tool, at in sorted(oldest.items()):
            age.add_metric([tool], max(0.0, (now_ms - at) / 1000))
        yield age

        lag = GaugeMetricFamily(
            "callgate_consumer_lag", "Input records not yet processed.", labels=["process"]
        )
        for process, n in sorted(self._stats.consumer_lag().items()):
            lag.add_metric([process], n)
        yield lag

        yield GaugeMetricFamily(
            "callgate_dead_letters", "Records dead-lettered.", value=self._stats.dead_letters()
        )
        stalls = CounterMetricFamily(
            "callgate_worker_stalls",
            "Workers ended by their watchdog (a blocking client call past its bound) and "
            "restarted.",
            labels=["process"],
        )
        for process, n in sorted(self._stats.stalls().items()):
            stalls.add_metric([process], n)
        yield stalls
        differed = self._stats.shadow_differed()
        if differed is not None:
            yield GaugeMetricFamily(
                "callgate_shadow_decisions_differed",
                "Live decisions the shadow policy version decided otherwise (ADR 0050).",
                value=differed,
            )


class LimitUsageCollector(Collector):
    """Usage against limit (ADR 0079), per limit only: a label per actor or tenant would
    grow with the users. The busiest scope's share, the scopes at their limit, what is held."""

    def __init__(self, items: Callable[[], Sequence[tuple[str, Mapping[str, Any]]]]) -> None:
        self._items = items

    def collect(self) -> Iterator[Metric]:
        from callgate.domain.usage import used_now

        now = int(time.time() * 1000)
        busiest: dict[str, float] = {}
        full: Counter[str] = Counter()
        scopes: Counter[str] = Counter()
        held: Counter[str] = Counter()
        for _, v in self._items():
            limit, used, most = str(v["limit"]), used_now(v, now), max(1, int(v["max"]))
            busiest[limit] = max(busiest.get(limit, 0.0), used / most)
            full[limit] += used >= most
            scopes[limit] += 1
            held[limit] += int(v["held"])
        for name, text, values in (
            ("callgate_limit_usage_ratio", "The busiest scope's usage over its limit.", busiest),
            ("callgate_limit_scopes", "Scopes with usage recorded.", scopes),
            ("callgate_limit_scopes_at_limit", "Scopes whose usage reached the limit.", full),
            ("callgate_limit_held", "Amounts held by calls not yet settled.", held),
        ):
            family = GaugeMetricFamily(name, text, labels=["limit"])
            for limit, n in sorted(values.items()):
                family.add_metric([limit], float(n))
            yield family


class ApiMetrics:
    def __init__(
        self,
        feed: PendingSource,
        stats: ServiceStats,
        collectors: Sequence[Collector] = (),
        statuses: Callable[[str], Mapping[str, Any] | None] = lambda _: None,
        final: Callable[[str, Mapping[str, Any]], str | None] = lambda _i, _s: None,
    ) -> None:
        """``final``: an invocation's final outcome code from its status, None if it is
        not final yet (``Gateway.is_final``)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self._statuses = statuses
        self._final = final
        self._open: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self.outcome_latency = Histogram(
            "callgate_outcome_latency_seconds",
            "From a proposal made through the API to its final outcome, by tool and outcome.",
            labelnames=["tool", "outcome"],
            buckets=OUTCOME_BUCKETS,
            registry=self.registry,
        )
        self.approval_wait = Histogram(
            "callgate_approval_wait_seconds",
            "From an approval's request to its leaving the pending view, by tool and result.",
            labelnames=["tool", "result"],
            buckets=APPROVAL_BUCKETS,
            registry=self.registry,
        )
        for collector in collectors:  # the providers' (callgate.providers.metrics)
            self.registry.register(collector)
        self.latency = Histogram(
            "callgate_decision_latency_seconds",
            "From publishing a proposal to its settled answer, seen by the API.",
            labelnames=["tool"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(StateCollector(feed, stats))

    def proposed(self, invocation_id: str, tool: str, proposed_at_ms: int) -> None:
        """A proposal the API published: its outcome latency is observed once it is final."""
        self._open[invocation_id] = (tool, proposed_at_ms)
        if len(self._open) > OPEN_KEPT:
            self._open.popitem(last=False)
        self.observe_outcomes([invocation_id])

    def observe_outcomes(self, invocation_ids: Sequence[str] | None = None) -> None:
        """Observe the outcome latency of the open invocations now final (all: a scrape)."""
        for invocation_id in list(self._open if invocation_ids is None else invocation_ids):
            status = self._statuses(invocation_id)
            outcome = None if status is None else self._final(invocation_id, status)
            if status is None or outcome is None:
                continue
            tool, proposed_at_ms = self._open.pop(invocation_id)
            at = status.get("updated_at")
            ended = at if isinstance(at, int) and at > 0 else time.time() * 1000
            self.outcome_latency.labels(tool, outcome).observe(
                max(0.0, (ended - proposed_at_ms) / 1000)
            )

    def approval_closed(self, row: Mapping[str, Any]) -> None:
        """A pending approval left the view: observe how long it waited, and how it ended
        (the status view's ``approval.state``: granted, denied or expired)."""
        requested_at = row.get("requested_at")
        if not isinstance(requested_at, int):
            return
        status = self._statuses(str(row.get("invocation_id"))) or {}
        result = str((status.get("approval") or {}).get("state") or "unknown")
        waited = max(0.0, time.time() - requested_at / 1000)
        self.approval_wait.labels(str(row.get("tool")), result).observe(waited)
