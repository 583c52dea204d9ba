"""Which agent acts for whom (issue 38.4): the agent (``azp``) and the RFC 8693 delegation
chain (``act``) of the verified session are on every event that records the principal, in
the audit export beside the user, and in the spans. Embedded store, dev issuer signing
tokens shaped as a provider's (``azp``, nested ``act``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.codes import Code, Rejection
from callgate.domain.identity import MAX_DELEGATION_DEPTH
from callgate.domain.scope import OPERATOR_ROLE
from callgate.tracing import Tracing
from callgate_projections.audit import GENESIS, record_hash, verify_chain
from callgate_projections.export import format_line

# The agent platform "planner" acts for alice through callgate's MCP surface, which was
# itself handed the call by "orchestrator": the outermost act is the current actor.
ACT = {"sub": "planner", "act": {"sub": "orchestrator"}}
CHAIN = ("planner", "orchestrator")


def app_with_spans(state_dir: Path, exporter: InMemorySpanExporter) -> tuple[App, Tracing]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = bootstrap(Settings(state_dir=state_dir, dev=True))
    app.tracing = tracing = Tracing(provider)
    tracing.install()
    return app, tracing


def token(app: App, user: str, roles: tuple[str, ...], **extra: Any) -> str:
    return app.session_issuer.issue(user, "acme", roles, app.clock(), extra=extra)


def test_agent_and_chain_are_on_every_event_recording_the_principal_the_export_and_spans(
    tmp_path: Path,
) -> None:
    exporter = InMemorySpanExporter()
    app, tracing = app_with_spans(tmp_path, exporter)
    gate = app.gateway()
    try:
        alice = token(app, "alice", ("support",), azp="agent-cli", act=ACT)
        read = gate.propose(alice, "tickets.read", {"ticket_id": "T-1"})
        spoof = gate.propose(alice, "tickets.create", {"title": "t", "requester_id": "bob"})
        refund = {"order_id": "ORD-1", "amount_cents": 25_000, "currency": "EUR",
                  "issued_by": "alice"}  # fmt: skip
        held = gate.propose(alice, "refunds.issue", refund)
        # A target the profile gives no owner: its system of record is asked (C7).
        gate.propose(alice, "tickets.read", {"ticket_id": "X-1"})
        events = list(gate.backend.read_events())
        operator = token(app, "olga", (OPERATOR_ROLE,))
        records = gate.audit_chains(operator)
    finally:
        gate.close()
        tracing.shutdown()
    assert read["outcome"] == "executed", read
    assert spoof["outcome"] == "identity_spoof", spoof
    assert held["outcome"] == "approval_required", held

    recording = (
        ev.PolicyDecided,
        ev.ProposalRejected,
        ev.ApprovalRequested,
        ev.DryRunRequested,
        ev.ExecutionRequested,
        ev.ResourceDescriptionRequested,
    )
    seen = {type(e) for e in events if isinstance(e, recording)}
    assert seen == set(recording)
    for event in events:
        if isinstance(event, recording):
            assert (event.actor, event.agent, tuple(event.delegation)) == (
                "alice",
                "agent-cli",
                CHAIN,
            ), event

    # The audit export, beside the user: the record and its OCSF and CloudEvents lines.
    mine = [r for r in records if r["invocation_id"] == read["invocation_id"]]
    assert mine and verify_chain(records).ok
    principal = mine[-1]["authorized_by"]["principal"]
    assert principal == {
        "user": "alice",
        "tenant": "acme",
        "roles": ["support"],
        "agent": "agent-cli",
        "delegation": list(CHAIN),
    }
    ocsf = json.loads(format_line("ocsf", mine[-1]))
    assert ocsf["actor"]["user"]["uid"] == "alice"
    assert ocsf["actor"]["app_uid"] == "agent-cli"
    assert ocsf["unmapped"]["callgate_audit"]["authorized_by"]["principal"]["delegation"] == list(
        CHAIN
    )
    cloud = json.loads(format_line("cloudevents", mine[-1]))
    assert cloud["data"]["authorized_by"]["principal"]["agent"] == "agent-cli"

    # The spans: the decision's span names the user, the agent and the chain.
    decided = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "callgate.decide" and (s.attributes or {}).get("callgate.decision")
    ]
    assert decided
    for span in decided:
        attributes = dict(span.attributes or {})
        assert attributes["enduser.id"] == "alice"
        assert attributes["callgate.tenant"] == "acme"
        assert attributes["gen_ai.agent.id"] == "agent-cli"
        assert tuple(attributes["callgate.delegation"]) == CHAIN  # type: ignore[arg-type]
    rejected = [
        s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("callgate.outcome") == "identity_spoof"
        and s.name == "callgate.decide"
    ]
    assert rejected and dict(rejected[0].attributes or {})["gen_ai.agent.id"] == "agent-cli"


# An approvals UI ("approvals-ui") acts for the approver, handed the decision by a
# review bot: the approver's own agent and chain, recorded beside the approver.
APPROVER_ACT = {"sub": "review-bot", "act": {"sub": "approvals-ui"}}
APPROVER_CHAIN = ("review-bot", "approvals-ui")
REFUND = {"order_id": "ORD-9", "amount_cents": 25_000, "currency": "EUR", "issued_by": "alice"}
DEPLOY = {"service": "checkout", "version": "2.4.1", "environment": "production"}


def test_the_approvers_agent_and_chain_are_on_the_decision_events_and_the_audit(
    tmp_path: Path,
) -> None:
    app = bootstrap(Settings(state_dir=tmp_path, dev=True))
    gate = app.gateway()
    try:
        alice = token(app, "alice", ("support",), azp="agent-cli", act=ACT)
        bob = token(app, "bob", ("finance-approver",), azp="approvals-ui", act=APPROVER_ACT)
        granted = gate.propose(alice, "refunds.issue", REFUND)
        assert gate.approve(granted["invocation_id"], bob)["outcome"] == "executed"
        denied = gate.propose(alice, "refunds.issue", {**REFUND, "order_id": "ORD-10"})
        gate.deny(denied["invocation_id"], bob, "not this one")
        # A quorum (ADR 0030): each release manager's grant names their own agent.
        rita = token(app, "rita", ("release",), azp="deploy-bot")
        deploy = gate.propose(rita, "deploys.trigger", DEPLOY)
        managers = [
            token(app, "rm-1", ("release-manager",), azp="approvals-ui", act=APPROVER_ACT),
            token(app, "rm-2", ("release-manager",), client_id="cli-approver"),
        ]
        for manager in managers:
            gate.approve(deploy["invocation_id"], manager)
        events = list(gate.backend.read_events())
        records = gate.audit_chains(token(app, "olga", (OPERATOR_ROLE,)))
    finally:
        gate.close()
    decided = [
        (type(e).__name__, e.invocation_id, e.approver, e.agent, tuple(e.delegation))
        for e in events
        if isinstance(e, ev.ApprovalGranted | ev.ApprovalDenied | ev.ApprovalGrantRecorded)
    ]
    assert decided == [
        ("ApprovalGranted", granted["invocation_id"], "bob", "approvals-ui", APPROVER_CHAIN),
        ("ApprovalDenied", denied["invocation_id"], "bob", "approvals-ui", APPROVER_CHAIN),
        ("ApprovalGrantRecorded", deploy["invocation_id"], "rm-1", "approvals-ui",
         APPROVER_CHAIN),
        ("ApprovalGrantRecorded", deploy["invocation_id"], "rm-2", "cli-approver", ()),
        ("ApprovalGranted", deploy["invocation_id"], "rm-2", "cli-approver", ()),
    ]  # fmt: skip

    # The audit record: the approver's agent and chain beside the approver, the caller's
    # beside the caller; the export's lines carry both.
    assert verify_chain(records).ok
    last = {r["invocation_id"]: r for r in records}
    for invocation, state in ((granted, "granted"), (denied, "denied")):
        record = last[invocation["invocation_id"]]
        assert record["approval_request"] == {
            "state": state,
            "approver": "bob",
            "approval_jti": record["approval_request"]["approval_jti"],
            "approver_agent": "approvals-ui",
            "approver_delegation": list(APPROVER_CHAIN),
        }
        assert record["authorized_by"]["principal"]["agent"] == "agent-cli"
    exported = json.loads(format_line("cloudevents", last[granted["invocation_id"]]))
    assert exported["data"]["approval_request"]["approver_agent"] == "approvals-ui"
    deployed = last[deploy["invocation_id"]]["approval_request"]
    assert (deployed["approver"], deployed["approver_agent"]) == ("rm-2", "cli-approver")


def test_a_token_without_agent_or_act_records_them_empty(tmp_path: Path) -> None:
    app = bootstrap(Settings(state_dir=tmp_path, dev=True))
    gate = app.gateway()
    try:
        read = gate.propose(token(app, "alice", ("support",)), "tickets.read", {"ticket_id": "T-1"})
        decided = [
            e
            for e in gate.backend.read_events(ev.PolicyDecided)
            if isinstance(e, ev.PolicyDecided) and e.invocation_id == read["invocation_id"]
        ]
    finally:
        gate.close()
    assert [(e.agent, tuple(e.delegation)) for e in decided] == [("", ())]


@pytest.mark.parametrize(
    ("act", "why"),
    [
        ("planner", "claim 'act' must be an object"),
        ({"iss": "https://idp.example"}, "must name a non-empty string 'sub'"),
        ({"sub": ""}, "must name a non-empty string 'sub'"),
        ({"sub": 7}, "must name a non-empty string 'sub'"),
        ({"sub": "planner", "act": ["x"]}, "claim 'act' must be an object"),
        ({"sub": "planner "}, "claim 'act.sub' has surrounding white space"),
        ({"sub": "plan\u200bner"}, "claim 'act.sub' contains the invisible"),
    ],
)
def test_a_malformed_act_chain_is_unauthenticated_never_recorded_in_part(
    tmp_path: Path, act: object, why: str
) -> None:
    app = bootstrap(Settings(state_dir=tmp_path, dev=True))
    with pytest.raises(Rejection) as info:
        app.session_verifier.verify(token(app, "alice", ("support",), act=act), app.clock())
    assert info.value.code is Code.UNAUTHENTICATED
    assert why in info.value.message


def test_the_chain_is_bounded_in_depth(tmp_path: Path) -> None:
    app = bootstrap(Settings(state_dir=tmp_path, dev=True))

    def nested(depth: int) -> dict[str, Any]:
        act: dict[str, Any] = {"sub": f"actor-{depth}"}
        for level in range(depth - 1, 0, -1):
            act = {"sub": f"actor-{level}", "act": act}
        return act

    deepest = token(app, "alice", ("support",), act=nested(MAX_DELEGATION_DEPTH))
    principal = app.session_verifier.verify(deepest, app.clock())
    assert principal.delegation == tuple(f"actor-{i}" for i in range(1, MAX_DELEGATION_DEPTH + 1))
    with pytest.raises(Rejection) as info:
        app.session_verifier.verify(
            token(app, "alice", ("support",), act=nested(MAX_DELEGATION_DEPTH + 1)), app.clock()
        )
    assert f"nested deeper than {MAX_DELEGATION_DEPTH}" in info.value.message


def chained_before(**fields: Any) -> dict[str, Any]:
    """An audit record as chained before the agent and delegation fields, with ``fields``,
    hashed without them (what the old code hashed)."""
    old: dict[str, Any] = {
        "invocation_id": "i-1",
        "partition_key": "pk",
        "proposed_by": "model",
        "authorized_by": {
            "decision": "permit",
            "principal": {"user": "alice", "tenant": "acme", "roles": ["support"]},
            "policy_version": "pv",
            "determining_policies": [],
            "resource": None,
            "approval": None,
        },
        **fields,
        "occurred_at": 1,
        "seq": 1,
        "prev_hash": GENESIS,
    }
    old["hash"] = record_hash(old)
    return old


def test_an_audit_record_chained_before_agent_and_delegation_still_verifies() -> None:
    """A record hashed without the fields, read back with the schema that has them (their
    default filled in, as the Avro reader does), verifies; one that names an agent is
    covered by its hash."""
    old = chained_before(outcome="executed", revision=1)  # what the old code hashed
    read_back = json.loads(json.dumps(old))
    read_back["authorized_by"]["principal"].update(agent=None, delegation=[])
    assert verify_chain([read_back]).ok
    forged = json.loads(json.dumps(read_back))
    forged["authorized_by"]["principal"]["agent"] = "agent-cli"
    assert not verify_chain([forged]).ok


def test_an_audit_record_chained_before_the_approvers_agent_still_verifies() -> None:
    """The same for the approval request's later fields: absent when the record was
    chained, filled with their default when read back; a named agent is covered."""
    old = chained_before(
        approval_request={"state": "granted", "approver": "bob", "approval_jti": "j-1"},
        outcome="approval_required",
        revision=2,
    )
    read_back = json.loads(json.dumps(old))
    read_back["authorized_by"]["principal"].update(agent=None, delegation=[])
    read_back["approval_request"].update(approver_agent=None, approver_delegation=[])
    assert verify_chain([read_back]).ok
    forged = json.loads(json.dumps(read_back))
    forged["approval_request"]["approver_agent"] = "approvals-ui"
    assert not verify_chain([forged]).ok
