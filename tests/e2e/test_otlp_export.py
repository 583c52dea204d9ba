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
