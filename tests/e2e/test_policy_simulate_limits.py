"""``callgate policy simulate`` of a candidate's limits (issue 40, ADR 0079): the recorded
history replayed in order with the candidate's limits reports exactly the calls they
would have refused, through the command line, on the embedded backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from callgate.bootstrap import Settings
from callgate.surfaces.sdk import Gateway, connect
from tests.e2e.helpers import cg, ops, run
from tests.limits_support import limited_profile, refund

pytestmark = pytest.mark.e2e

TEN_REFUNDS_A_DAY: dict[str, Any] = {
    "name": "refunds-per-actor",
    "tools": ["refunds.issue"],
    "max": 10,
    "window": "24h",
    "per": ["actor"],
}


def record(state: Path, profile: Path) -> tuple[list[str], list[str]]:
    """12 refunds of alice and 3 of bob, one after the other, with a replay of alice's
    third among them and reads no limit covers; each actor's refund ids in order."""
    gate: Gateway = connect(Settings(state_dir=state, dev=True, profile=profile))
    try:
        now = gate.app.clock()
        alice = gate.app.session_issuer.issue("alice", "acme", ["support"], now)
        bob = gate.app.session_issuer.issue("bob", "acme", ["support"], now)
        ids: dict[str, list[str]] = {"alice": [], "bob": []}

        def refunds(who: str, session: str, i: int, key: str | None = None) -> dict[str, Any]:
            args = refund(i) | {"issued_by": who}
            answer = gate.propose(session=session, tool="refunds.issue", args=args,
                                  idempotency_key=key)  # fmt: skip
            return answer

        for i in range(12):
            answer = refunds("alice", alice, i, key="third" if i == 2 else None)
            assert answer["outcome"] == "executed", answer
            ids["alice"].append(answer["invocation_id"])
            if i == 5:
                replayed = refunds("alice", alice, 2, key="third")
                assert replayed["outcome"] == "replayed", replayed
            if i % 4 == 0:
                answer = refunds("bob", bob, 100 + i)
                assert answer["outcome"] == "executed", answer
                ids["bob"].append(answer["invocation_id"])
                gate.propose(session=bob, tool="tickets.read", args={"ticket_id": f"T-{i}"})
        return ids["alice"], ids["bob"]
    finally:
        gate.close()


def test_a_candidate_limit_reports_exactly_the_calls_it_would_have_refused(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    live = limited_profile(tmp_path / "live")  # no limits: every refund executed
    alice, bob = record(state, live)
    candidate = limited_profile(tmp_path / "candidate", TEN_REFUNDS_A_DAY)

    report = cg(state, "policy", "simulate", str(candidate), "--session", ops(state),
                profile=live)  # fmt: skip

    refused = report["limit_refusals"]
    print("refused:", refused)
    assert [r["invocation_id"] for r in refused] == alice[10:]  # the 11th and the 12th
    for r in refused:
        assert r["tool"] == "refunds.issue" and (r["tenant"], r["actor"]) == ("acme", "alice")
        assert r["limit"] == "refunds-per-actor" and r["window"] == "24h"
        assert (r["used"], r["max"], r["amount"]) == (10, 10, 1)
        assert isinstance(r["retry_after_s"], int) and r["retry_after_s"] > 0
    assert report["by_transition"] == {"executed → limit_exceeded": 2}
    assert not set(bob) & {e["invocation_id"] for e in report["examples"]}

    human = run(state, "policy", "simulate", str(candidate), "--session", ops(state),
                json_mode=False, profile=live).stdout  # fmt: skip
    assert "2 refused by its limits" in human
    assert all(invocation in human for invocation in alice[10:])
    assert not any(invocation in human for invocation in alice[:10])


def test_the_limits_in_force_refused_what_the_same_candidate_reports_unchanged(
    tmp_path: Path,
) -> None:
    """Recorded under the limit itself: the 11th and 12th were refused then; simulating the
    same limits reports them again and changes nothing."""
    state = tmp_path / "state"
    live = limited_profile(tmp_path / "live", TEN_REFUNDS_A_DAY)
    gate: Gateway = connect(Settings(state_dir=state, dev=True, profile=live))
    try:
        alice = gate.app.session_issuer.issue("alice", "acme", ["support"], gate.app.clock())
        answers = [
            gate.propose(
                session=alice, tool="refunds.issue", args=refund(i) | {"issued_by": "alice"}
            )
            for i in range(12)
        ]
    finally:
        gate.close()
    assert [a["outcome"] for a in answers] == ["executed"] * 10 + ["limit_exceeded"] * 2

    report = cg(state, "policy", "simulate", str(live), "--session", ops(state), profile=live)

    refused = [r["invocation_id"] for r in report["limit_refusals"]]
    assert refused == [a["invocation_id"] for a in answers[10:]]
    assert report["changed"] == 0 and report["decided"] == 12
