"""Spans reach a real OTLP receiver (ADR 0036): ``callgate propose`` runs as a process
configured by its ``callgate.toml`` (``[tracing]``), and exports over OTLP/gRPC to a
TraceService on loopback built from ``opentelemetry-proto``'s generated stubs, and over
OTLP/HTTP (protobuf) to a loopback HTTP receiver."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.e2e.helpers import propose_argv, run, session
from tests.integration.test_tracing import CALLER_SPAN, CALLER_TRACE, TRACEPARENT

pytestmark = pytest.mark.e2e

Received = list[trace_service_pb2.ExportTraceServiceRequest]


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.received.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    received: Received = []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add = trace_service_pb2_grpc.add_TraceServiceServicer_to_server  # generated, untyped
    add(_TraceService(received), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(grace=None)


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Received]]:
    received: Received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            assert self.path == "/v1/traces"
            assert self.headers["Content-Type"] == "application/x-protobuf"
            received.append(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()
            self.wfile.write(trace_service_pb2.ExportTraceServiceResponse().SerializeToString())

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1/traces", received
    finally:
        server.shutdown()
        server.server_close()


def spans_of(received: Received) -> list[Any]:
    return [
        span
        for request in received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]


def service_names(received: Received) -> set[str]:
    return {
        attr.value.string_value
        for request in received
        for resource in request.resource_spans
        for attr in resource.resource.attributes
        if attr.key == "service.name"
    }


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
    spans = spans_of(received)
    names = {s.name for s in spans}
    assert {"execute_tool tickets.read", "callgate.decide", "callgate.provider execute"} <= names
    assert {s.trace_id.hex() for s in spans} == {CALLER_TRACE}
    (root,) = [s for s in spans if s.name == "execute_tool tickets.read"]
    assert root.parent_span_id.hex() == CALLER_SPAN
    attributes = {a.key: a.value.string_value for a in root.attributes}
    assert attributes["gen_ai.tool.name"] == "tickets.read"
    assert attributes["callgate.invocation_id"] == answer["invocation_id"]
    assert service_names(received) == {"callgate-under-test"}
