"""Traces across Apache Kafka (ADR 0036): the invocation's context travels in the records'
``traceparent`` header, so the invocations process's spans (another process than the
caller's, with its own consumer group and transactions) share the caller's trace, and the
events it writes carry it on to the projections."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.integration.test_tracing import CALLER_SPAN, CALLER_TRACE, TRACEPARENT, by_name
from tests.kafka_support import unique_prefix

from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.kafka.client import FAST_GROUP_SETTINGS, read_partitions_to_end
from callgate.adapters.kafka.runner import KafkaRunner
from callgate.adapters.kafka.serve import create_topics
from callgate.adapters.kafka.topics import Topics
from callgate.bootstrap import App, Settings, bootstrap
from callgate.tracing import Tracing

pytestmark = pytest.mark.kafka


@pytest.fixture
def traced_kafka(
    kafka_bootstrap: str, tmp_path: Path
) -> Iterator[tuple[App, InMemorySpanExporter]]:
    """A Kafka deployment whose invocations process runs here, traced in memory."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    settings = Settings(
        backend="kafka",
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=unique_prefix("traces"),
        partitions=3,
        state_dir=tmp_path,
        dev=True,
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = bootstrap(settings)
    app.tracing = Tracing(provider)
    app.tracing.install()
    create_topics(app)
    stop = threading.Event()
    threads = []
    for process in (app.invocations(),):
        runner = KafkaRunner(
            process, AvroCodec.default(), Topics(settings.topic_prefix, 3), settings.brokers,
            "traces", tmp_path / "kafka", app.clock, batch_timeout_ms=50,
            consumer_overrides=FAST_GROUP_SETTINGS, tracing=app.tracing,
        )  # fmt: skip
        thread = threading.Thread(target=runner.run, args=(stop,), daemon=True)
        thread.start()
        threads.append(thread)
    try:
        yield app, exporter
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)


def test_the_context_travels_in_kafka_headers(
    traced_kafka: tuple[App, InMemorySpanExporter],
) -> None:
    app, exporter = traced_kafka
    gate = app.gateway()
    try:
        alice = app.session_issuer.issue("alice", "acme", ("support",), app.clock())
        answer = gate.propose(
            alice, "tickets.read", {"ticket_id": "T-1"}, traceparent=TRACEPARENT, timeout_s=60
        )
    finally:
        gate.close()
    assert answer["outcome"] == "executed", answer
    named = by_name(exporter.get_finished_spans())
    root = named["execute_tool tickets.read"]
    assert root.parent is not None and root.parent.span_id == int(CALLER_SPAN, 16)
    decide, provider = named["callgate.decide"], named["callgate.provider execute"]
    # the caller and the runner: two processes, joined only by the records' headers
    assert decide.context.trace_id == provider.context.trace_id == int(CALLER_TRACE, 16)
    assert decide.parent is not None and decide.parent.span_id == root.context.span_id
    topics = Topics(app.settings.topic_prefix, 3)
    for logical in ("requests", "events"):
        records = read_partitions_to_end(app.settings.brokers, topics.physical(logical))
        mine = [r for r in records if r.headers.get("traceparent")]
        assert mine, logical
        assert {r.headers["traceparent"].decode().split("-")[1] for r in mine} == {CALLER_TRACE}
