"""``callgate policy simulate`` (issue 29, part 2): the recorded history decided again.

A history of mixed calls is recorded with the default profile; a candidate that forbids
refunds over 500 EUR is simulated through the command line, and the calls it reports are
checked against a count made here, independently, from what the test proposed.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from callgate.bootstrap import Settings
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.sdk import Gateway, connect
from tests.e2e.helpers import DEFAULT_PROFILE, EXIT_FAILED, EXIT_MISUSE, cg, run

pytestmark = pytest.mark.e2e

FORBID_OVER_500_EUR = """
@id("refunds-over-500-eur")
forbid (principal, action == Action::"refunds.issue", resource)
when { context.args.amount_cents > 50000 && context.args.currency == "EUR" };
"""


def candidate_profile(tmp_path: Path, extra_policy: str) -> Path:
    """The default profile with ``extra_policy`` appended to its Cedar policy."""
    folder = tmp_path / "candidate"
    folder.mkdir(parents=True)
    shutil.copy(DEFAULT_PROFILE, folder / "default.yaml")
    cedar = (DEFAULT_PROFILE.parent / "default.cedar").read_text(encoding="utf-8")
    (folder / "default.cedar").write_text(cedar + extra_policy, encoding="utf-8")
    return folder / "default.yaml"


def record_history(gate: Gateway, seed: int) -> dict[str, str]:
    """Mixed calls of two tenants; the invocation ids a 500 EUR cap must change, with the
    outcome each had (the independent count)."""
    rng = random.Random(seed)
    now = gate.app.clock()
    issue = gate.app.session_issuer.issue
    acme = issue("alice", "acme", ["support"], now)
    globex = issue("gina", "globex", ["support"], now)
    expected: dict[str, str] = {}
    for n in range(60):
        kind = rng.choice(["read", "refund", "refund", "foreign-refund"])
        if kind == "read":
            gate.propose(session=acme, tool="tickets.read", args={"ticket_id": f"T-{n}"})
            continue
        amount = rng.choice([1_000, 40_000, 50_000, 50_001, 90_000, 150_000])
        currency = rng.choice(["EUR", "USD"])
        foreign = kind == "foreign-refund"
        args: dict[str, Any] = {
            "order_id": f"ORD-{n}",  # acme's orders: globex's refunds are forbidden already
            "amount_cents": amount,
            "currency": currency,
            "issued_by": "gina" if foreign else "alice",
        }
        answer = gate.propose(session=globex if foreign else acme, tool="refunds.issue", args=args)
        if foreign:
            assert answer["outcome"] == "tool_forbidden", answer
        elif amount > 50_000 and currency == "EUR":
            expected[answer["invocation_id"]] = answer["outcome"]
    return expected


def test_a_candidate_reports_exactly_the_calls_it_would_change(tmp_path: Path) -> None:
    state = tmp_path / "state"
    gate = connect(Settings(state_dir=state, dev=True))
    try:
        expected = record_history(gate, seed=29)
    finally:
        gate.close()
    assert expected, "the history holds refunds the candidate forbids"
    operator = cg(
        state, "session", "issue", "--user", "olga", "--tenant", "ops", "--roles", OPERATOR_ROLE
    )["token"]
    candidate = candidate_profile(tmp_path, FORBID_OVER_500_EUR)

    report = cg(state, "policy", "simulate", str(candidate), "--session", operator)

    assert report["decided"] == 60  # every call of the history reached the policy
    assert report["changed"] == len(expected)
    transitions = {f"{outcome} → tool_forbidden" for outcome in expected.values()}
    assert set(report["by_transition"]) == transitions
    assert report["by_tool"] == {"refunds.issue": len(expected)}
    for example in report["examples"]:
        assert example["invocation_id"] in expected
        assert example["reason"] == "refunds-over-500-eur"

    # The live policy decided nothing differently: simulating it changes nothing.
    same = cg(state, "policy", "simulate", str(DEFAULT_PROFILE), "--session", operator)
    assert same["changed"] == 0 and same["decided"] == report["decided"]

    # --tenant narrows to one tenant's decisions, exactly.
    globex = cg(
        state, "policy", "simulate", str(candidate), "--session", operator, "--tenant", "globex"
    )
    assert globex["changed"] == 0 and 0 < globex["decided"] < report["decided"]


def test_refusals_change_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    gate = connect(Settings(state_dir=state, dev=True))
    try:
        record_history(gate, seed=7)
        # A record on the log that is not an event: dead-lettered, never simulated.
        gate.backend.store.append_raw("events", "acme", b"\x00not avro")  # type: ignore[attr-defined]
        events_before = sum(1 for _ in gate.backend.read_events())
    finally:
        gate.close()
    candidate = candidate_profile(tmp_path, FORBID_OVER_500_EUR)
    alice = cg(
        state, "session", "issue", "--user", "alice", "--tenant", "acme", "--roles", "support"
    )["token"]

    refused = run(
        state, "policy", "simulate", str(candidate), "--session", alice, rc=EXIT_FAILED
    ).value
    assert refused["error"]["code"] == "operator_required"

    operator = cg(
        state, "session", "issue", "--user", "olga", "--tenant", "ops", "--roles", OPERATOR_ROLE
    )["token"]
    broken = candidate_profile(tmp_path / "b", "forbid (principal, action")
    misuse = run(
        state, "policy", "simulate", str(broken), "--session", operator, rc=EXIT_MISUSE
    ).value
    assert misuse["error"]["code"] == "usage" and "Cedar" in misuse["error"]["message"]

    report = cg(state, "policy", "simulate", str(candidate), "--session", operator)
    assert report["changed"] > 0  # the poison record stopped nothing

    gate = connect(Settings(state_dir=state, dev=True))
    try:
        assert sum(1 for _ in gate.backend.read_events()) == events_before  # nothing written
    finally:
        gate.close()
