"""OpenTelemetry traces of invocations (ADR 0036): spans are made here, in the shell.

One trace per invocation. The proposal's span (``execute_tool {tool}``, the GenAI
semantic conventions' tool-execution span) is a child of the caller's context when one
arrives (a W3C ``traceparent`` from HTTP headers, MCP ``_meta`` or the SDK call). Its
context is written with the request (a log-row column on the embedded store, a record
header on Kafka) and every record a process emits for the invocation carries it on, so
the decider's, the executor's and the provider's spans are its children wherever they
run. The deciders stay pure: they never see a span; the runners ask this module for one
around ``handle`` and ``follow_up``.

Off by default: the composition root builds ``Tracing`` only for ``[tracing] enabled``;
otherwise every runner holds ``None`` and this module's OpenTelemetry imports never run.
No span carries arguments or results (a sensitive field could be among them: ADR 0035).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from callgate.domain import events as ev
from callgate.domain.process_port import ViewRecord

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

    from callgate.domain.process_port import Output

TRACEPARENT = "traceparent"
# Invocations whose context a runner keeps for inputs that arrive without one (an
# approver's decision): bounded, least recently used first out.
CONTEXTS_KEPT = 16_384

# The span of each input a process reacts to (other inputs get none: projections fold
# events, they decide nothing an operator follows a call by). A dry-run or a description
# the step asks for runs inside it (ADR 0077): its provider span is the step's child; the
# execution runs after the step's commit, its provider span a child of the invocation's.
_HANDLE_SPANS = {
    ("invocations", "ToolCallProposed"): "callgate.decide",
    ("invocations", "ApprovalDecisionSubmitted"): "callgate.approval",
}

_TRACED_PROCESSES = frozenset(process for process, _ in _HANDLE_SPANS)

# The one tracing object of this process, when on: providers ask it for the context to
# pass on to their upstreams (``outgoing``) without importing OpenTelemetry when off.
_ACTIVE: Tracing | None = None


def outcome_of(event: Output) -> str | None:
    """The vocabulary's outcome an output settles the invocation with, if any."""
    if isinstance(event, ev.ProposalRejected):
        return event.code
    if isinstance(event, ev.ExecutionSucceeded):
        return "executed"
    if isinstance(event, ev.ExecutionFailed):
        return event.code or "execution_failed"
    if isinstance(event, ev.ExecutionUncertain):
        return "outcome_uncertain"
    if isinstance(event, ev.ApprovalDenied):
        return "approval_denied"
    if isinstance(event, ev.ApprovalExpired):
        return "approval_expired"
    if isinstance(event, ev.ReplayServed):
        return "replayed"
    return None


class Tracing:
    """Spans of this process's part of each invocation, on ``provider``."""

    enabled = True

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("callgate")
        self._propagator = TraceContextTextMapPropagator()
        self._contexts: OrderedDict[str, str] = OrderedDict()
        self._approval_asked: OrderedDict[str, int] = OrderedDict()

    def install(self) -> None:
        """Make this the process's tracing (providers pass its context on)."""
        global _ACTIVE
        _ACTIVE = self

    def shutdown(self) -> None:
        """Export what is buffered and stop (the end of ``callgate serve``)."""
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        self.provider.shutdown()

    # -- propagation --------------------------------------------------------------------

    def context_of(self, traceparent: str | None) -> Context | None:
        """The context a W3C ``traceparent`` names; ``None`` for none or a malformed one."""
        if not traceparent:
            return None
        from opentelemetry import trace

        ctx = self._propagator.extract({TRACEPARENT: traceparent})
        return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None

    def current(self) -> str | None:
        """The ``traceparent`` of the current span (``None`` outside a recorded one)."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier)
        return carrier.get(TRACEPARENT)

    def remember(self, invocation_id: str, traceparent: str) -> None:
        kept = self._contexts
        kept[invocation_id] = traceparent
        kept.move_to_end(invocation_id)
        if len(kept) > CONTEXTS_KEPT:
            kept.popitem(last=False)

    def of(self, invocation_id: str, traceparent: str | None = None) -> str | None:
        """The invocation's context: ``traceparent`` as it came with the input, else the
        one this process saw with an earlier input of the invocation."""
        if traceparent:
            self.remember(invocation_id, traceparent)
            return traceparent
        return self._contexts.get(invocation_id)

    # -- spans --------------------------------------------------------------------------

    @staticmethod
    def follows(process: str) -> bool:
        """Whether ``process`` makes spans (the invocations process; projections fold
        events an operator does not follow a call by, and emit none to carry it on)."""
        return process in _TRACED_PROCESSES

    @contextmanager
    def proposal(
        self, tool: str, traceparent: str | None, attributes: Mapping[str, Any] | None = None
    ) -> Iterator[Span]:
        """The invocation's root span, a child of the caller's context if one came."""
        from opentelemetry import trace

        with self.tracer.start_as_current_span(
            f"execute_tool {tool}",
            context=self.context_of(traceparent),
            kind=trace.SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                **(attributes or {}),
            },
        ) as span:
            yield span

    @contextmanager
    def handling(
        self, process: str, event: ev.Event, traceparent: str | None
    ) -> Iterator[Callable[[Sequence[Output]], None]]:
        """Around one ``handle``: a span for the inputs in ``_HANDLE_SPANS``, a child of
        the invocation's context; the yielded callable notes the outputs on it."""
        invocation_id = event.invocation_id
        known = self.of(invocation_id, traceparent)
        if known is None:
            yield _ignore
            return
        name = _HANDLE_SPANS.get((process, event.event_type))
        if name is None:  # most inputs (every projection's): no span, no context parsed
            yield lambda outputs: self._settled(invocation_id, known, outputs)
            return
        with self.tracer.start_as_current_span(
            name,
            context=self.context_of(known),
            attributes=_invocation(invocation_id, getattr(event, "tool", "")),
        ) as span:

            def note(outputs: Sequence[Output]) -> None:
                _note(span, outputs)
                self._settled(invocation_id, known, outputs)

            yield note

    @contextmanager
    def following(
        self, committed: Sequence[ev.Event]
    ) -> Iterator[Callable[[Sequence[Output]], None]]:
        """Around one key's ``follow_up`` (the executor's provider call): the invocation's
        context is current, so the provider's span and its upstream request continue it."""
        invocation_id = committed[0].invocation_id if committed else ""
        known = self.of(invocation_id) if committed else None
        context = self.context_of(known)
        if context is None or known is None:
            yield _ignore
            return
        from opentelemetry import context as otel_context

        token = otel_context.attach(context)
        try:
            yield lambda outputs: self._settled(invocation_id, known, outputs)
        finally:
            otel_context.detach(token)

    @contextmanager
    def provider_call(self, provider: str, operation: str) -> Iterator[None]:
        """A provider's call, a child of the current span (none outside an invocation)."""
        from opentelemetry import trace

        if not trace.get_current_span().get_span_context().is_valid:
            yield
            return
        with self.tracer.start_as_current_span(
            f"callgate.provider {operation}",
            kind=trace.SpanKind.CLIENT,
            attributes={"callgate.provider": provider, "callgate.provider.operation": operation},
        ):
            yield

    def _settled(self, invocation_id: str, traceparent: str, outputs: Sequence[Output]) -> None:
        """The approval wait and outcome spans the outputs close."""
        for out in outputs:
            if isinstance(out, ViewRecord):
                continue
            if isinstance(out, ev.ApprovalRequested):
                self._approval_asked[invocation_id] = out.occurred_at
                if len(self._approval_asked) > CONTEXTS_KEPT:
                    self._approval_asked.popitem(last=False)
            elif isinstance(out, ev.ApprovalGranted | ev.ApprovalDenied | ev.ApprovalExpired):
                self._approval_wait(invocation_id, traceparent, out)
            outcome = outcome_of(out)
            if outcome is not None:
                attributes = _invocation(invocation_id, "")
                attributes["callgate.outcome"] = outcome
                context = self.context_of(traceparent)
                self.tracer.start_span(
                    "callgate.outcome", context=context, attributes=attributes
                ).end()

    def _approval_wait(self, invocation_id: str, traceparent: str, out: ev.Event) -> None:
        """From the approval's request (when this process saw it) to its decision."""
        asked = self._approval_asked.pop(invocation_id, None)
        attributes = _invocation(invocation_id, "")
        if isinstance(out, ev.ApprovalGranted):
            attributes["callgate.approval_id"] = out.approval_id
        attributes["callgate.outcome"] = outcome_of(out) or "approved"
        start = None if asked is None else asked * 1_000_000
        span = self.tracer.start_span(
            "callgate.approval_wait",
            context=self.context_of(traceparent),
            attributes=attributes,
            start_time=start,
        )
        span.end(
            end_time=None if not out.occurred_at else max(out.occurred_at * 1_000_000, start or 0)
        )


def outgoing() -> dict[str, str]:
    """The ``traceparent`` to send to an upstream (HTTP header, MCP ``_meta``): empty when
    tracing is off or no span is current."""
    if _ACTIVE is None:
        return {}
    current = _ACTIVE.current()
    return {} if current is None else {TRACEPARENT: current}


def provider_call(provider: str, operation: str) -> Any:
    """``Tracing.provider_call`` of the active tracing; a no-op context when off."""
    if _ACTIVE is None:
        from contextlib import nullcontext

        return nullcontext()
    return _ACTIVE.provider_call(provider, operation)


def _ignore(outputs: Sequence[Output]) -> None:
    return None


def _invocation(invocation_id: str, tool: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {"callgate.invocation_id": invocation_id}
    if tool:
        attributes["gen_ai.tool.name"] = tool
    return attributes


def _note_principal(
    span: Span, user: str, tenant: str, agent: str, delegation: Sequence[str]
) -> None:
    """Who the call is for (issue 38.4): the verified user (OpenTelemetry's
    ``enduser.id``), the tenant, the agent acting for them (``gen_ai.agent.id``) and the
    RFC 8693 delegation chain, the current actor first; identifiers, never arguments."""
    span.set_attribute("enduser.id", user)
    span.set_attribute("callgate.tenant", tenant)
    if agent:
        span.set_attribute("gen_ai.agent.id", agent)
    if delegation:
        span.set_attribute("callgate.delegation", list(delegation))


def _note(span: Span, outputs: Sequence[Output]) -> None:
    """What the outputs of one ``handle`` say: the policy version, decision, outcome."""
    for out in outputs:
        if isinstance(out, ev.PolicyDecided):
            span.set_attribute("callgate.policy_version", out.policy_version)
            span.set_attribute("callgate.decision", out.decision)
            _note_principal(span, out.actor, out.tenant, out.agent, out.delegation)
        elif isinstance(out, ev.ProposalRejected) and out.actor:
            _note_principal(span, out.actor, out.tenant, out.agent, out.delegation)
        elif isinstance(out, ev.ApprovalRequested):
            span.set_attribute("callgate.outcome", "approval_required")
            span.set_attribute("callgate.policy_version", out.policy_version)
        elif isinstance(out, ev.ApprovalGranted):
            span.set_attribute("callgate.approval_id", out.approval_id)
        outcome = outcome_of(out)
        if outcome is not None:
            span.set_attribute("callgate.outcome", outcome)


def tracer_provider(
    *,
    exporter: str,
    endpoint: str,
    headers: Mapping[str, str],
    sampling_ratio: float,
    service_name: str,
    timeout_s: float,
    instance_id: str,
) -> TracerProvider:
    """The SDK provider exporting over OTLP (the composition root calls this, for
    ``[tracing] enabled`` only): batched, sampled by ratio for new traces, a caller's
    sampled trace always continued."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    span_exporter: Any
    if exporter == "otlp_http":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        span_exporter = OTLPSpanExporter(
            endpoint=endpoint, headers=dict(headers), timeout=timeout_s
        )
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        span_exporter = GrpcExporter(
            endpoint=endpoint,
            headers=dict(headers),
            timeout=timeout_s,
            insecure=endpoint.startswith("http://"),
        )
    provider = TracerProvider(
        resource=Resource.create(
            {"service.name": service_name, "service.instance.id": instance_id}
        ),
        sampler=ParentBased(TraceIdRatioBased(sampling_ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return provider
