"""Policy versions as events and the shadow policy (issue 29, parts 1 and 3; ADR 0050),
through the command line on the embedded store.

A version is published and activated with ``callgate policy``; decisions name it; an
earlier version is activated again (rollback). A candidate that forbids refunds over
500 EUR runs in shadow while the same mixed traffic as the simulation test is proposed:
the disagreements it records are exactly the calls the simulation reports and an
independent count made here expects, and no outcome changes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from callgate.bootstrap import Settings
from callgate.domain.events import PolicyDecided
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.sdk import connect
from tests.e2e.helpers import DEFAULT_PROFILE, EXIT_FAILED, EXIT_MISUSE, cg, run
from tests.e2e.test_policy_simulate import (
    FORBID_OVER_500_EUR,
    candidate_profile,
    record_history,
)

pytestmark = pytest.mark.e2e


def _operator(state: Path) -> str:
    token: str = cg(
        state, "session", "issue", "--user", "olga", "--tenant", "ops", "--roles", OPERATOR_ROLE
    )["token"]
    return token


def _refund(state: Path, session: str, amount: int) -> dict[str, object]:
    answer: dict[str, object] = cg(
        state, "propose", "--tool", "refunds.issue", "--session", session, "--args",
        f'{{"order_id": "ORD-9", "amount_cents": {amount}, "currency": "EUR", '
        '"issued_by": "alice"}',
    )  # fmt: skip
    return answer


def _version_of(state: Path, answer: dict[str, object]) -> str:
    """The policy version the log's ``PolicyDecided`` names for the answered call."""
    gate = connect(Settings(state_dir=state, dev=True))
    try:
        return next(
            e.policy_version
            for e in gate.backend.read_events(only=PolicyDecided)
            if isinstance(e, PolicyDecided) and e.invocation_id == answer["invocation_id"]
        )
    finally:
        gate.close()


def test_publish_activate_history_and_rollback(tmp_path: Path) -> None:
    state = tmp_path / "state"
    operator = _operator(state)
    alice = cg(
        state, "session", "issue", "--user", "alice", "--tenant", "acme", "--roles", "support"
    )["token"]
    base = cg(state, "policy", "publish", str(DEFAULT_PROFILE), "--session", operator,
              "--reason", "the shipped profile")["published"]  # fmt: skip
    candidate = candidate_profile(tmp_path, FORBID_OVER_500_EUR)
    strict = cg(state, "policy", "publish", str(candidate), "--session", operator,
                "--reason", "cap EUR refunds")["published"]  # fmt: skip
    assert base != strict

    before = _refund(state, alice, 90_000)
    assert before["outcome"] != "tool_forbidden"

    cg(state, "policy", "activate", strict, "--session", operator, "--reason", "INC-7")
    after = _refund(state, alice, 90_000)
    assert after["outcome"] == "tool_forbidden"
    assert _version_of(state, after) == strict  # the decision names the version it used

    # Rollback: activating the earlier version.
    cg(state, "policy", "activate", base, "--session", operator, "--reason", "rollback")
    again = _refund(state, alice, 90_000)
    assert again["outcome"] == before["outcome"] and _version_of(state, again) == base

    history = cg(state, "policy", "history", "--session", operator)
    assert history["active"] == base
    assert [(h["action"], h["version"], h["reason"]) for h in history["history"]] == [
        ("published", base, "the shipped profile"),
        ("published", strict, "cap EUR refunds"),
        ("activated", strict, "INC-7"),
        ("activated", base, "rollback"),
    ]
    assert {h["author"] for h in history["history"]} == {"olga"}


def test_shadow_records_what_the_simulation_predicts_and_changes_nothing(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    operator = _operator(state)
    candidate = candidate_profile(tmp_path, FORBID_OVER_500_EUR)
    strict = cg(state, "policy", "publish", str(candidate), "--session", operator,
                "--reason", "try the cap")["published"]  # fmt: skip
    cg(state, "policy", "shadow", strict, "--session", operator, "--reason", "a week")

    # The same traffic twice: once with the shadow on, once (another state) without.
    gate = connect(Settings(state_dir=state, dev=True))
    try:
        expected = record_history(gate, seed=29)
        shadowed = {k: v["outcome"] for k, v in gate.backend.view_items("status")}
    finally:
        gate.close()
    plain_state = tmp_path / "plain"
    gate = connect(Settings(state_dir=plain_state, dev=True))
    try:
        plain_expected = record_history(gate, seed=29)
        plain = sorted(v["outcome"] for _, v in gate.backend.view_items("status"))
    finally:
        gate.close()
    assert expected and sorted(expected.values()) == sorted(plain_expected.values())
    assert sorted(shadowed.values()) == plain  # the shadow changed no outcome

    report = cg(state, "policy", "shadow", "report", "--session", operator)
    simulated = cg(state, "policy", "simulate", str(candidate), "--session", operator)
    differed = {d["invocation_id"] for d in report["differences"]}
    assert differed == set(expected)  # the independent count
    assert report["differed"] == simulated["changed"] == len(expected)
    assert all(d["candidate_outcome"] == "tool_forbidden" for d in report["differences"])
    assert all(d["candidate_version"] == strict for d in report["differences"])

    cg(state, "policy", "shadow", "--off", "--session", operator)
    assert cg(state, "policy", "history", "--session", operator)["shadow"] is None


def test_hostile_input_is_refused_with_a_code_and_changes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    operator = _operator(state)
    good = cg(state, "policy", "publish", str(DEFAULT_PROFILE), "--session", operator,
              "--reason", "base")["published"]  # fmt: skip
    alice = cg(
        state, "session", "issue", "--user", "alice", "--tenant", "acme", "--roles", "support"
    )["token"]
    before = cg(state, "policy", "history", "--session", operator)

    broken = candidate_profile(tmp_path / "b", "forbid (principal, action")
    refused = run(state, "policy", "publish", str(broken), "--session", operator,
                  "--reason", "x", rc=EXIT_FAILED).value  # fmt: skip
    assert refused["error"]["code"] == "policy_version_invalid"
    unknown = run(state, "policy", "activate", "0" * 64, "--session", operator,
                  "--reason", "x", rc=EXIT_FAILED).value  # fmt: skip
    assert unknown["error"]["code"] == "policy_version_unknown"

    # Not an operator (a role that merely looks like it is not it: exact comparison).
    lookalike = cg(state, "session", "issue", "--user", "eve", "--tenant", "acme",
                   "--roles", OPERATOR_ROLE.upper())["token"]  # fmt: skip
    for session in (alice, lookalike):
        for argv in (
            ("publish", str(DEFAULT_PROFILE), "--reason", "x"),
            ("activate", good, "--reason", "x"),
            ("shadow", good),
            ("shadow", "--off"),
            ("shadow", "report"),
            ("history",),
        ):
            answer = run(state, "policy", *argv, "--session", session, rc=EXIT_FAILED).value
            assert answer["error"]["code"] == "operator_required", argv

    missing = run(state, "policy", "activate", good, "--session", operator, rc=EXIT_MISUSE).value
    assert missing["error"]["code"] == "usage"  # --reason is required
    assert cg(state, "policy", "history", "--session", operator) == before


def test_a_running_serve_switches_without_restart_and_counts_shadow_differences(
    tmp_path: Path,
) -> None:
    """``serve`` keeps running while versions are activated and a shadow set: the next
    decisions use them, and ``/metrics`` counts the shadow's disagreements."""
    from tests.http_support import HttpServe, wait_until

    state = tmp_path / "state"
    serve = HttpServe(state, tmp_path / "serve.log", dev=True)
    try:
        serve.wait_ready()
        operator = serve.token("olga", "ops", OPERATOR_ROLE)
        alice = serve.token("alice", "acme", "support")
        candidate = candidate_profile(tmp_path, FORBID_OVER_500_EUR)
        strict = cg(state, "policy", "publish", str(candidate), "--session", operator,
                    "--reason", "cap")["published"]  # fmt: skip
        cg(state, "policy", "shadow", strict, "--session", operator, "--reason", "watch")
        shadowed = _refund(state, alice, 90_000)
        assert shadowed["outcome"] != "tool_forbidden"  # the shadow changes no outcome
        with serve.client() as c:
            wait_until(
                lambda: "callgate_shadow_decisions_differed 1.0" in c.get("/metrics").text,
                20,
                "the shadow difference on /metrics",
            )
        with serve.client(operator) as c:
            shadow = c.get("/v1/policy/shadow").json()
            assert shadow["differed"] == 1
            assert shadow["differences"][0]["invocation_id"] == shadowed["invocation_id"]
        with serve.client(alice) as c:
            refused = c.get("/v1/policy/shadow")
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "operator_required"
        cg(state, "policy", "activate", strict, "--session", operator, "--reason", "go")
        enforced = _refund(state, alice, 90_000)
        assert enforced["outcome"] == "tool_forbidden"
        assert _version_of(state, enforced) == strict
    finally:
        assert serve.stop() == 0, serve.log.read_text()
