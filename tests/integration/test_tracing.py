"""Traces of invocations on the embedded store (ADR 0036), with the SDK's in-memory exporter:
one trace per invocation, the caller's trace continued, the span tree and attributes."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from callgate.application.client import Gateway
from callgate.bootstrap import App, Settings, bootstrap
from callgate.tracing import Tracing

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


def traced_app(state_dir: Path, exporter: InMemorySpanExporter) -> App:
    """The composition root's app with the in-memory exporter in place of OTLP."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = bootstrap(Settings(state_dir=state_dir, dev=True))
    app.tracing = Tracing(provider)  # what ``[tracing]`` would build
    app.tracing.install()
    return app


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def token(app: App, user: str, roles: tuple[str, ...]) -> str:
    return app.session_issuer.issue(user, "acme", roles, app.clock())


def test_an_executed_call_is_one_trace_continuing_the_callers(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    app = traced_app(tmp_path, exporter)
    gate: Gateway = app.gateway()
    try:
        answer = gate.propose(
            token(app, "alice", ("support",)),
            "tickets.read",
            {"ticket_id": "T-1"},
            traceparent=TRACEPARENT,
        )
    finally:
        gate.close()
    assert answer["outcome"] == "executed"
    spans = exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans} == {int(CALLER_TRACE, 16)}
    named = by_name(spans)
    root = named["execute_tool tickets.read"]
    assert root.parent is not None and root.parent.span_id == int(CALLER_SPAN, 16)
    assert root.attributes is not None
    assert root.attributes["gen_ai.operation.name"] == "execute_tool"
    assert root.attributes["gen_ai.tool.name"] == "tickets.read"
    assert root.attributes["callgate.invocation_id"] == answer["invocation_id"]
    assert root.attributes["callgate.outcome"] == "executed"
    decide = named["callgate.decide"]
    assert decide.parent is not None and decide.parent.span_id == root.context.span_id
    assert decide.attributes is not None
    assert decide.attributes["callgate.policy_version"]
    assert decide.attributes["callgate.decision"] == "permit"
    provider = named["callgate.provider execute"]
    assert provider.parent is not None and provider.parent.span_id == root.context.span_id
    assert provider.attributes == {
        "callgate.provider": "tickets",
        "callgate.provider.operation": "execute",
    }
    outcome = named["callgate.outcome"]
    assert outcome.attributes is not None
    assert outcome.attributes["callgate.outcome"] == "executed"
    assert outcome.attributes["callgate.invocation_id"] == answer["invocation_id"]
    for span in spans:  # no arguments in any span
        assert "T-1" not in repr(dict(span.attributes or {}))


def test_an_approval_wait_is_in_the_proposers_trace(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    """The approver's decision carries no context; the approving process (a new one: no
    memory of the proposal) finds it on the invocation's rows."""
    proposer = traced_app(tmp_path, exporter)
    gate = proposer.gateway()
    try:
        held = gate.propose(
            token(proposer, "alice", ("support",)),
            "refunds.issue",
            {"order_id": "ORD-1", "amount_cents": 25_000, "currency": "EUR", "issued_by": "alice"},
        )
    finally:
        gate.close()
    assert held["outcome"] == "approval_required"
    approver = traced_app(tmp_path, exporter)
    gate = approver.gateway()
    try:
        bob = token(approver, "bob", ("finance-approver",))
        approved = gate.approve(held["invocation_id"], bob)
        assert approved["outcome"] in ("approved", "executed"), approved
        final = gate.wait(held["invocation_id"], token(approver, "alice", ("support",)), 10)
    finally:
        gate.close()
    assert final["outcome"] == "executed", final
    spans = exporter.get_finished_spans()
    named = by_name(spans)
    root = named["execute_tool refunds.issue"]
    assert root.parent is None  # no caller context: the proposal starts the trace
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    decide = named["callgate.decide"].attributes
    assert decide is not None and decide["callgate.decision"] == "permit"
    assert decide["callgate.policy_version"] and decide["gen_ai.tool.name"] == "refunds.issue"
    wait = named["callgate.approval_wait"]
    assert wait.attributes is not None
    assert str(wait.attributes["callgate.approval_id"])
    assert wait.attributes["callgate.outcome"] == "approved"
    approval = named["callgate.approval"]
    assert approval.parent is not None and approval.parent.span_id == root.context.span_id
    assert approval.attributes is not None
    assert approval.attributes["callgate.approval_id"] == wait.attributes["callgate.approval_id"]
    assert named["callgate.provider execute"].context.trace_id == root.context.trace_id
    # The dry-runs run inside the step that asks for them (ADR 0077): the proposal's for
    # the approver to see, the grant's to confirm it.
    dry_runs = [s for s in spans if s.name == "callgate.provider dry_run"]
    assert sorted(s.parent.span_id for s in dry_runs if s.parent is not None) == sorted(
        [named["callgate.decide"].context.span_id, approval.context.span_id]
    )


def test_tracing_is_off_by_default(tmp_path: Path) -> None:
    """Off: no tracer provider, and the log rows carry no context."""
    app = bootstrap(Settings(state_dir=tmp_path, dev=True))
    assert app.tracing is None
    gate = app.gateway()
    try:
        answer = gate.propose(
            token(app, "alice", ("support",)),
            "tickets.read",
            {"ticket_id": "T-1"},
            traceparent=TRACEPARENT,
        )
        assert answer["outcome"] == "executed"
        rows = gate.backend.store._conn().execute(  # type: ignore[attr-defined]
            "SELECT count(*) FROM log WHERE traceparent IS NOT NULL"
        )
        assert rows.fetchone()[0] == 0
    finally:
        gate.close()


def test_http_continues_the_callers_traceparent(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    """``POST /v1/proposals`` with a ``traceparent`` header, on the real FastAPI app."""
    from starlette.testclient import TestClient

    from callgate.adapters.embedded.stats import EmbeddedStats
    from callgate.surfaces.http.app import asgi
    from callgate.surfaces.http.context import HttpOptions
    from callgate.surfaces.http.server import build_context

    app = traced_app(tmp_path, exporter)
    backend = app.embedded_backend()
    stats = EmbeddedStats(backend.store, app.processes(), lambda: None)
    ctx, _ = build_context(app, backend, stats, HttpOptions())
    try:
        with TestClient(asgi(ctx, dev_mode=True)) as client:
            r = client.post(
                "/v1/proposals",
                json={"tool": "tickets.read", "args": {"ticket_id": "T-1"}},
                headers={
                    "Authorization": f"Bearer {token(app, 'alice', ('support',))}",
                    "traceparent": TRACEPARENT,
                },
            )
    finally:
        backend.close()
    assert r.status_code == 200, r.text
    spans = exporter.get_finished_spans()
    root = by_name(spans)["execute_tool tickets.read"]
    assert root.parent is not None and root.parent.span_id == int(CALLER_SPAN, 16)
    assert {s.context.trace_id for s in spans} == {int(CALLER_TRACE, 16)}


@pytest.mark.anyio
async def test_mcp_continues_the_callers_traceparent_in_meta(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    """``tools/call`` with ``_meta.traceparent``, through the MCP SDK's client."""
    import mcp

    from callgate.surfaces.mcp.bridge import GatewayBridge
    from callgate.surfaces.mcp.server import McpOptions, build_server

    app = traced_app(tmp_path, exporter)
    bridge = GatewayBridge(app)
    server = build_server(bridge, McpOptions(session=token(app, "alice", ("support",))))
    try:
        async with mcp.Client(server) as client:
            result = await client.call_tool(
                "tickets.read",
                {"ticket_id": "T-1"},
                meta=cast("mcp.types.RequestParamsMeta", {"traceparent": TRACEPARENT}),
            )
    finally:
        bridge.close()
    assert not result.is_error, result
    spans = exporter.get_finished_spans()
    root = by_name(spans)["execute_tool tickets.read"]
    assert root.parent is not None and root.parent.span_id == int(CALLER_SPAN, 16)
    assert root.attributes is not None
    assert root.attributes["mcp.method.name"] == "tools/call"
    assert root.attributes["jsonrpc.request.id"]
    assert {s.context.trace_id for s in spans} == {int(CALLER_TRACE, 16)}


def test_tracing_settings_from_callgate_toml(tmp_path: Path) -> None:
    """``[tracing]`` builds the SDK's provider in the composition root; a bad exporter is
    a configuration error naming the key; ``config check`` redacts the headers."""
    from opentelemetry.sdk.trace import TracerProvider

    from callgate.config import ConfigError
    from callgate.config.redaction import redacted

    conf = tmp_path / "callgate.toml"
    conf.write_text(
        '[tracing]\nenabled = true\nexporter = "otlp_http"\n'
        'endpoint = "http://127.0.0.1:9/v1/traces"\nsampling_ratio = 0.5\n'
        '[tracing.headers]\nauthorization = "Bearer SECRET"\n'
    )
    settings = Settings.from_env(config_file=conf, environ={}, state_dir=tmp_path)
    assert settings.tracing.exporter == "otlp_http" and settings.tracing.sampling_ratio == 0.5
    app = bootstrap(settings)
    tracing = app.tracing
    assert tracing is not None and isinstance(tracing.provider, TracerProvider)
    assert "0.5" in tracing.provider.sampler.get_description()
    tracing.shutdown()
    dumped = redacted(settings.model_dump(mode="json"))
    assert dumped["tracing"]["headers"] == "<redacted>"
    with pytest.raises(ConfigError, match=r"tracing\.exporter"):
        Settings.from_env(environ={"CALLGATE_TRACING__EXPORTER": "zipkin"}, state_dir=tmp_path)
