"""What tracing costs (ADR 0036): the same work with ``[tracing]`` off and on, in one run.

Two rows on the embedded store, off and on alternated (A/B) so drift hits both alike:

- sequential ``Gateway.propose`` (the SDK's path: append, run the processes in-process,
  read the status view), median per call, with each call continuing a caller's trace;
- the runner's throughput over a published burst whose requests carry a trace context.

"On" is the SDK's tracer provider with its batch span processor, as ``[tracing]`` builds
it, exporting to an exporter that drops the spans: the figure is what the calls pay for
recording spans, not the collector's network (the batch processor exports off the path).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from callgate.bootstrap import App, Settings, bootstrap
from callgate.tracing import Tracing
from tools.bench_core import Row, mixed_proposals

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _tracing() -> Tracing:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    return Tracing(provider)


def _app(traced: bool) -> App:
    app = bootstrap(Settings(state_dir=Path(tempfile.mkdtemp(prefix="callgate-bench-")), dev=True))
    if traced:
        app.tracing = _tracing()
        app.tracing.install()
    return app


def _sequential(app: App, n: int) -> list[float]:
    gate = app.gateway()
    token = app.session_issuer.issue("bench", "acme", ["support"], app.clock(), 86_400)
    seconds: list[float] = []
    try:
        for i in range(n):
            t0 = time.perf_counter()
            answer = gate.propose(
                token, "tickets.read", {"ticket_id": f"T-{i}"}, traceparent=TRACEPARENT
            )
            seconds.append(time.perf_counter() - t0)
            assert answer["outcome"] == "executed", answer
    finally:
        gate.close()
    return seconds


def _burst(app: App, n: int) -> float:
    from callgate.adapters.avro_codec import AvroCodec
    from callgate.adapters.embedded.store import EmbeddedStore

    codec = AvroCodec.default()
    store = EmbeddedStore(app.settings.state_dir, codec)
    proposals = mixed_proposals(app, n)
    for p in proposals:  # each request carries a caller's context, as a traced client's would
        store.append([p], TRACEPARENT if app.tracing is not None else None)
    runner = app.embedded_runner(store, codec)
    assert runner.try_acquire()
    t0 = time.perf_counter()
    runner.run_until_idle(max_seconds=3600)
    seconds = time.perf_counter() - t0
    runner.release()
    settled = sum(
        1 for p in proposals if (v := store.view("status", p.invocation_id)) and json.loads(v)
    )
    store.close()
    assert settled == n, (settled, n)
    return n / seconds


def bench_tracing(n_calls: int, n_burst: int, rounds: int = 3) -> list[Row]:
    calls: dict[bool, list[float]] = {False: [], True: []}
    rates: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for traced in (False, True):
            calls[traced] += _sequential(_app(traced), n_calls)
            rates[traced].append(_burst(_app(traced), n_burst))
    _uninstall()
    off_ms, on_ms = (statistics.median(calls[t]) * 1000 for t in (False, True))
    off_rate, on_rate = (statistics.median(rates[t]) for t in (False, True))
    return [
        Row(
            "tracing: sequential propose, median per call (off / on)",
            f"{off_ms:.2f} ms / {on_ms:.2f} ms (on/off {on_ms / off_ms:.2f}x)",
            "",
            None,
            f"{rounds} x {n_calls} calls each, A/B alternated; embedded, SDK in-process; "
            "spans batched to an exporter that drops them",
        ),
        Row(
            "tracing: embedded runner proposals/s (off / on)",
            f"{off_rate:,.0f}/s / {on_rate:,.0f}/s (on/off {on_rate / off_rate:.2f}x)",
            "",
            None,
            f"median of {rounds} bursts of {n_burst} (70/20/10 mix), each request traced",
        ),
    ]


def _uninstall() -> None:
    """Leave no tracing active for what the bench runs next."""
    import callgate.tracing as tracing

    tracing._ACTIVE = None


def main(argv: Any = None) -> None:  # pragma: no cover - ``python -m tools.bench_tracing``
    for row in bench_tracing(200, 2_000):
        print(f"{row.measure}: {row.value}  ({row.note})")


if __name__ == "__main__":
    main()
