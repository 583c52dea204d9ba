"""ADR 0030: a catalog entry can require N distinct approvers, none of them the actor.

The shipped profile's ``deploys.trigger`` to ``production`` needs two release managers.
Each grant is an event bound to the invocation's snapshot, arguments and policy version;
the artifact exists, and the invocation continues (ADR 0029), only at the quorum; any
deny ends it; identities are compared folded, so no one grants twice.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.harness import Gate

from callgate.domain import events as ev

Args = dict[str, Any]
DEPLOY: Args = {"service": "billing", "version": "2.0.0", "environment": "production"}
STAGING: Args = {**DEPLOY, "environment": "staging"}


@pytest.fixture
def g(tmp_path: Path) -> Gate:
    return Gate(tmp_path / "state", continuation=True)


def rejections(g: Gate, invocation_id: str) -> list[str]:
    return [e.code for e in g.events_of(invocation_id, ev.ApprovalDecisionRejected)]


def test_two_of_n_stays_pending_after_one_grant_and_runs_after_the_second(g: Gate) -> None:
    actor = g.session("rita", roles=("release",))
    first = g.session("mona", roles=("release-manager",))
    second = g.session("max", roles=("release-manager",))
    inv = g.propose(actor, "deploys.trigger", DEPLOY)
    assert g.outcome(inv) == "approval_required"
    assert g.pending()[inv]["approvals_required"] == 2
    g.decide(first, inv)
    # one grant: recorded, still pending, no artifact, nothing ran
    (recorded,) = g.events_of(inv, ev.ApprovalGrantRecorded)
    assert (recorded.approver, recorded.granted, recorded.required) == ("mona", 1, 2)
    requested = g.events_of(inv, ev.ApprovalRequested)[0]
    assert (recorded.args_hash, recorded.dry_run_hash, recorded.policy_version) == (
        requested.args_hash,
        requested.dry_run_hash,
        requested.policy_version,
    )
    assert g.events_of(inv, ev.ApprovalGranted) == []
    assert g.pending()[inv]["grants"] == ["mona"]
    assert g.status(inv)["quorum"]["grants"] == ["mona"]
    assert g.effects() == []
    # the second distinct approver meets the quorum: artifact, continuation, one effect
    g.decide(second, inv)
    (granted,) = g.events_of(inv, ev.ApprovalGranted)
    assert granted.approvers == ("mona", "max")
    assert inv not in g.pending()
    assert g.outcome(inv) == "executed"
    assert len(g.effects()) == 1
    record = g.audit(inv)[-1]
    assert record["quorum"] == {"required": 2, "grants": ["mona", "max"]}
    assert record["authorized_by"]["approval"]["approved_invocation_id"] == inv


def test_staging_needs_one_approver(g: Gate) -> None:
    actor = g.session("rita", roles=("release",))
    boss = g.session("mona", roles=("release-manager",))
    inv = g.propose(actor, "deploys.trigger", STAGING)
    g.decide(boss, inv)
    assert g.outcome(inv) == "executed"
    assert g.events_of(inv, ev.ApprovalGrantRecorded) == []


@pytest.mark.parametrize("spelling", ["MONA", "\uff4d\uff4f\uff4e\uff41", "m\u043ena"])
def test_an_approver_granting_twice_is_refused(g: Gate, spelling: str) -> None:
    actor = g.session("rita", roles=("release",))
    mona = g.session("mona", roles=("release-manager",))
    again = g.session(spelling, roles=("release-manager",))
    inv = g.propose(actor, "deploys.trigger", DEPLOY)
    g.decide(mona, inv)
    g.decide(mona, inv)
    g.decide(again, inv)
    assert rejections(g, inv) == ["approver_forbidden", "approver_forbidden"]
    assert len(g.events_of(inv, ev.ApprovalGrantRecorded)) == 1
    assert g.events_of(inv, ev.ApprovalGranted) == []
    assert g.effects() == []
    assert g.outcome(inv) == "approval_required"


@pytest.mark.parametrize("spelling", ["RITA", "\uff52\uff49\uff54\uff41", "r\u0456ta"])
def test_the_actor_under_another_spelling_cannot_grant(g: Gate, spelling: str) -> None:
    actor = g.session("rita", roles=("release", "release-manager"))
    disguised = g.session(spelling, roles=("release-manager",))
    mona = g.session("mona", roles=("release-manager",))
    inv = g.propose(actor, "deploys.trigger", DEPLOY)
    g.decide(mona, inv)
    g.decide(disguised, inv)
    assert rejections(g, inv) == ["approver_forbidden"]
    assert g.events_of(inv, ev.ApprovalGranted) == []
    assert g.effects() == []


def test_a_deny_after_one_grant_ends_it(g: Gate) -> None:
    actor = g.session("rita", roles=("release",))
    mona = g.session("mona", roles=("release-manager",))
    max_ = g.session("max", roles=("release-manager",))
    inv = g.propose(actor, "deploys.trigger", DEPLOY)
    g.decide(mona, inv)
    g.decide(max_, inv, "deny", "not today")
    assert inv not in g.pending()
    assert g.status(inv)["approval"]["state"] == "denied"
    g.decide(g.session("zoe", roles=("release-manager",)), inv)
    assert rejections(g, inv) == ["not_pending"]
    assert g.effects() == []


def test_decisions_answer_each_grant(g: Gate) -> None:
    actor = g.session("rita", roles=("release",))
    mona = g.session("mona", roles=("release-manager",))
    max_ = g.session("max", roles=("release-manager",))
    inv = g.propose(actor, "deploys.trigger", DEPLOY)
    one = g.decide(mona, inv)
    two = g.decide(max_, inv)
    views = g.runner.log.views["decisions"]
    first, second = json.loads(views[one]), json.loads(views[two])
    assert (first["decision"], first["granted"], first["required"]) == ("recorded", 1, 2)
    assert (second["decision"], second["granted"]) == ("granted", 2)
    assert second["approval_id"]
