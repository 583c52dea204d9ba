"""A loopback OTLP receiver for the tests (ADR 0036): the OTLP TraceService over gRPC,
from ``opentelemetry-proto``'s generated stubs, and OTLP/HTTP with protobuf bodies."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

Received = list[trace_service_pb2.ExportTraceServiceRequest]


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.received.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@contextmanager
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


@contextmanager
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


def span_texts(received: Received) -> str:
    """Every span's name and attributes, and every resource attribute, as text."""
    lines = []
    for request in received:
        for resource in request.resource_spans:
            lines.append(str(resource.resource.attributes))
            for scope in resource.scope_spans:
                for span in scope.spans:
                    lines.append(f"{span.name} {span.attributes} {span.events}")
    return "\n".join(lines)
