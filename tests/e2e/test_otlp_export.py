"""Spans reach a real OTLP receiver (ADR 0036): ``callgate propose`` runs as a process
configured by its ``callgate.toml`` (``[tracing]``), and exports over OTLP/gRPC to a
TraceService on loopback built from ``opentelemetry-proto``'s generated stubs, and over
OTLP/HTTP (protobuf) to a loopback HTTP receiver."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import otlp_support as otlp
from tests.e2e.helpers import propose_argv, run, session
from tests.http_support import wait_until
from tests.integration.test_tracing import CALLER_SPAN, CALLER_TRACE, TRACEPARENT

pytestmark = pytest.mark.e2e
Received = otlp.Received


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    with otlp.grpc_receiver() as found:
        yield found


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Received]]:
    with otlp.http_receiver() as found:
        yield found


@pytest.mark.parametrize("exporter", ["otlp_grpc", "otlp_http"])
def test_callgate_exports_its_spans_over_otlp(
    exporter: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    endpoint, received = request.getfixturevalue(
        "grpc_receiver" if exporter == "otlp_grpc" else "http_receiver"
    )
    state = tmp_path / "state"
    state.mkdir()
    (state / "callgate.toml").write_text(
        "[tracing]\n"
        "enabled = true\n"
        f'exporter = "{exporter}"\n'
        f'endpoint = "{endpoint}"\n'
        'service_name = "callgate-under-test"\n'
        "[tracing.headers]\n"
        'x-tenant = "acme"\n'
    )
    alice = session(state, "alice", "acme", "support")
    argv = propose_argv(alice, "tickets.read", json.dumps({"ticket_id": "T-1"}))
    answer = run(state, *argv, "--traceparent", TRACEPARENT).value
    assert answer["outcome"] == "executed", answer
    spans = otlp.spans_of(received)
    names = {s.name for s in spans}
    assert {"execute_tool tickets.read", "callgate.decide", "callgate.provider execute"} <= names
    assert {s.trace_id.hex() for s in spans} == {CALLER_TRACE}
    (root,) = [s for s in spans if s.name == "execute_tool tickets.read"]
    assert root.parent_span_id.hex() == CALLER_SPAN
    attributes = {a.key: a.value.string_value for a in root.attributes}
    assert attributes["gen_ai.tool.name"] == "tickets.read"
    assert attributes["callgate.invocation_id"] == answer["invocation_id"]
    assert otlp.service_names(received) == {"callgate-under-test"}


@pytest.mark.kafka
def test_kafka_workers_export_one_trace(
    kafka_bootstrap: str, tmp_path: Path, grpc_receiver: tuple[str, Received]
) -> None:
    """``callgate serve`` on Apache Kafka: the decider's and the executor's workers (each its
    own process) export their spans of the call into the caller's trace."""
    from tests.kafka_support import Deployment, KafkaServe, cg, cli_session, unique_prefix

    endpoint, received = grpc_receiver
    config = tmp_path / "callgate.toml"
    config.write_text(f'[tracing]\nenabled = true\nendpoint = "{endpoint}"\n')
    dep = Deployment(kafka_bootstrap, unique_prefix("otlp"), tmp_path / "state", config=config)
    serve = KafkaServe(dep, tmp_path / "serve.log", extra_env={"OTEL_BSP_SCHEDULE_DELAY": "200"})
    try:
        serve.wait_ready()
        alice = cli_session(dep, "alice", "acme", "support")
        argv = propose_argv(alice, "tickets.read", json.dumps({"ticket_id": "T-1"}))
        answer = cg(dep, *argv, "--traceparent", TRACEPARENT)
        assert answer["outcome"] == "executed", answer

        def mine() -> set[str]:
            spans = otlp.spans_of(received)
            return {s.name for s in spans if s.trace_id.hex() == CALLER_TRACE}

        wanted = {"execute_tool tickets.read", "callgate.decide", "callgate.provider execute"}
        wait_until(lambda: wanted <= mine(), 30, f"the workers' spans: {mine()}")
    finally:
        assert serve.stop() == 0, serve.log.read_text()
