"""ADR 0030: a catalog entry can require N distinct approvers, none of them the actor.

The shipped profile's ``deploys.trigger`` to ``production`` needs two release managers.
Each grant is an event bound to the invocation's snapshot, arguments and policy version;
the artifact exists, and the invocation continues (ADR 0029), only at the quorum; any
deny ends it; identities are compared folded, so no one grants twice.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.harness import Gate

from callgate.domain import events as ev

Args = dict[str, Any]
DEPLOY: Args = {"service": "billing", "version": "2.0.0", "environment": "production"}
STAGING: Args = {**DEPLOY, "environment": "staging"}


def rejections(continuing_gate: Gate, invocation_id: str) -> list[str]:
    return [e.code for e in continuing_gate.events_of(invocation_id, ev.ApprovalDecisionRejected)]


def test_two_of_n_stays_pending_after_one_grant_and_runs_after_the_second(
    continuing_gate: Gate,
) -> None:
    actor = continuing_gate.session("rita", roles=("release",))
    first = continuing_gate.session("mona", roles=("release-manager",))
    second = continuing_gate.session("max", roles=("release-manager",))
    inv = continuing_gate.propose(actor, "deploys.trigger", DEPLOY)
    assert continuing_gate.outcome(inv) == "approval_required"
    assert continuing_gate.pending()[inv]["approvals_required"] == 2
    continuing_gate.decide(first, inv)
    # one grant: recorded, still pending, no artifact, nothing ran
    (recorded,) = continuing_gate.events_of(inv, ev.ApprovalGrantRecorded)
    assert (recorded.approver, recorded.granted, recorded.required) == ("mona", 1, 2)
    requested = continuing_gate.events_of(inv, ev.ApprovalRequested)[0]
    assert (recorded.args_hash, recorded.dry_run_hash, recorded.policy_version) == (
        requested.args_hash,
        requested.dry_run_hash,
        requested.policy_version,
    )
    assert continuing_gate.events_of(inv, ev.ApprovalGranted) == []
    assert continuing_gate.pending()[inv]["grants"] == ["mona"]
    assert continuing_gate.status(inv)["quorum"]["grants"] == ["mona"]
    assert continuing_gate.effects() == []
    # the second distinct approver meets the quorum: artifact, continuation, one effect
    continuing_gate.decide(second, inv)
    (granted,) = continuing_gate.events_of(inv, ev.ApprovalGranted)
    assert granted.approvers == ("mona", "max")
    assert inv not in continuing_gate.pending()
    assert continuing_gate.outcome(inv) == "executed"
    assert len(continuing_gate.effects()) == 1
    record = continuing_gate.audit(inv)[-1]
    assert record["quorum"] == {"required": 2, "grants": ["mona", "max"]}
    assert record["authorized_by"]["approval"]["approved_invocation_id"] == inv


def test_staging_needs_one_approver(continuing_gate: Gate) -> None:
    actor = continuing_gate.session("rita", roles=("release",))
    boss = continuing_gate.session("mona", roles=("release-manager",))
    inv = continuing_gate.propose(actor, "deploys.trigger", STAGING)
    continuing_gate.decide(boss, inv)
    assert continuing_gate.outcome(inv) == "executed"
    assert continuing_gate.events_of(inv, ev.ApprovalGrantRecorded) == []


@pytest.mark.parametrize("spelling", ["MONA", "\uff4d\uff4f\uff4e\uff41", "m\u043ena"])
def test_an_approver_granting_twice_is_refused(continuing_gate: Gate, spelling: str) -> None:
    actor = continuing_gate.session("rita", roles=("release",))
    mona = continuing_gate.session("mona", roles=("release-manager",))
    again = continuing_gate.session(spelling, roles=("release-manager",))
    inv = continuing_gate.propose(actor, "deploys.trigger", DEPLOY)
    continuing_gate.decide(mona, inv)
    continuing_gate.decide(mona, inv)
    continuing_gate.decide(again, inv)
    assert rejections(continuing_gate, inv) == ["approver_forbidden", "approver_forbidden"]
    assert len(continuing_gate.events_of(inv, ev.ApprovalGrantRecorded)) == 1
    assert continuing_gate.events_of(inv, ev.ApprovalGranted) == []
    assert continuing_gate.effects() == []
    assert continuing_gate.outcome(inv) == "approval_required"


@pytest.mark.parametrize("spelling", ["RITA", "\uff52\uff49\uff54\uff41", "r\u0456ta"])
def test_the_actor_under_another_spelling_cannot_grant(
    continuing_gate: Gate, spelling: str
) -> None:
    actor = continuing_gate.session("rita", roles=("release", "release-manager"))
    disguised = continuing_gate.session(spelling, roles=("release-manager",))
    mona = continuing_gate.session("mona", roles=("release-manager",))
    inv = continuing_gate.propose(actor, "deploys.trigger", DEPLOY)
    continuing_gate.decide(mona, inv)
    continuing_gate.decide(disguised, inv)
    assert rejections(continuing_gate, inv) == ["approver_forbidden"]
    assert continuing_gate.events_of(inv, ev.ApprovalGranted) == []
    assert continuing_gate.effects() == []


def test_a_deny_after_one_grant_ends_it(continuing_gate: Gate) -> None:
    actor = continuing_gate.session("rita", roles=("release",))
    mona = continuing_gate.session("mona", roles=("release-manager",))
    max_ = continuing_gate.session("max", roles=("release-manager",))
    inv = continuing_gate.propose(actor, "deploys.trigger", DEPLOY)
    continuing_gate.decide(mona, inv)
    continuing_gate.decide(max_, inv, "deny", "not today")
    assert inv not in continuing_gate.pending()
    assert continuing_gate.status(inv)["approval"]["state"] == "denied"
    continuing_gate.decide(continuing_gate.session("zoe", roles=("release-manager",)), inv)
    assert rejections(continuing_gate, inv) == ["not_pending"]
    assert continuing_gate.effects() == []


def test_decisions_answer_each_grant(continuing_gate: Gate) -> None:
    actor = continuing_gate.session("rita", roles=("release",))
    mona = continuing_gate.session("mona", roles=("release-manager",))
    max_ = continuing_gate.session("max", roles=("release-manager",))
    inv = continuing_gate.propose(actor, "deploys.trigger", DEPLOY)
    one = continuing_gate.decide(mona, inv)
    two = continuing_gate.decide(max_, inv)
    views = continuing_gate.runner.log.views["decisions"]
    first, second = json.loads(views[one]), json.loads(views[two])
    assert (first["decision"], first["granted"], first["required"]) == ("recorded", 1, 2)
    assert (second["decision"], second["granted"]) == ("granted", 2)
    assert second["approval_id"]
