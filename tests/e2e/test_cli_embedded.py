"""The installed ``callgate`` command on the embedded backend, end to end (docs/contract.md
"Command line").

Every test runs the real command as a subprocess against a fresh ``--state-dir``; the
helpers assert that stdout is exactly one JSON value and that no traceback escapes.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from callgate.domain.codes import Code
from tests.e2e.helpers import (
    DEFAULT_PROFILE,
    EXIT_FAILED,
    EXIT_MISUSE,
    EXIT_OK,
    Serve,
    cg,
    logged_event_types,
    ops,
    propose,
    propose_argv,
    run,
    runner_lock_held,
    session,
)

pytestmark = pytest.mark.e2e

VOCABULARY = {c.value for c in Code}
REFUND = {"order_id": "ORD-42", "amount_cents": 5000, "currency": "EUR"}  # < 10000: owner
BIG_REFUND = {"order_id": "ORD-77", "amount_cents": 25000, "currency": "EUR"}  # high impact
DEPLOY = {"service": "billing", "version": "2.0.0", "environment": "production"}
PROVIDER_EVENTS = {"DryRunRequested", "ExecutionRequested", "ExecutionStarted"}


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_v1_model_supplied_requester_is_identity_spoof(state: Path) -> None:
    """V1 / C6: a mutation naming another user is ``identity_spoof``; the command exits 0
    (a denial is a successful command) and nothing reaches a provider."""
    alice = session(state, "alice", "acme", "support")
    answer = propose(state, alice, "tickets.create", {"title": "x", "requester_id": "mallory"})
    assert answer["outcome"] == "identity_spoof"
    assert answer["error"]["code"] == "identity_spoof"
    assert "result" not in answer
    assert cg(state, "effects") == []
    assert not PROVIDER_EVENTS & set(logged_event_types(state, answer["invocation_id"]))
    [record] = cg(state, "audit", "--session", ops(state), "--invocation", answer["invocation_id"])
    assert record["proposed_by"] == "model" and record["outcome"] == "identity_spoof"  # C9


def test_v2_confirm_swap_arguments_then_replay_exactly_one_effect(state: Path) -> None:
    """V2 / C4, C5, C8, C9, C11: dry-run → owner confirms → swapped arguments are
    ``approval_mismatch`` → the confirmed call executes once → the same key replays it;
    the audit names the approval, verifies, and replays to the same projections."""
    alice = session(state, "alice", "acme", "support")
    gina = session(state, "gina", "globex", "support")
    key = "refund-ORD-42"

    first = propose(state, alice, "refunds.issue", REFUND, key=key)
    assert first["outcome"] == "approval_required"
    inv = first["invocation_id"]
    assert first["dry_run"]["order_id"] == "ORD-42" and first["dry_run"]["amount_cents"] == 5000
    assert "result" not in first and "approval_id" not in first
    assert cg(state, "effects") == []  # C5: a dry-run changes nothing

    [pending] = [
        p for p in cg(state, "pending", "--session", ops(state)) if p["invocation_id"] == inv
    ]
    assert pending["tool"] == "refunds.issue" and pending["tenant"] == "acme"
    assert pending["actor"] == "alice" and pending["confirmation"] == "owner"
    assert pending["args"] == REFUND and pending["dry_run"] == first["dry_run"]
    assert pending["expires_at"] > now_ms()
    assert inv in {p["invocation_id"] for p in cg(state, "pending", "--session", alice)}
    assert cg(state, "pending", "--session", gina) == []  # another tenant sees none of it

    approval = cg(state, "approve", inv, "--session", alice)
    assert approval["invocation_id"] == inv and approval["expires_at"] > now_ms()
    approval_id = approval["approval_id"]
    assert isinstance(approval_id, str) and approval_id
    # ADR 0029: the approved call ran, as approved, without any resubmission
    assert approval["outcome"] == "executed", approval
    assert inv not in {p["invocation_id"] for p in cg(state, "pending", "--session", ops(state))}

    swapped = propose(
        state, alice, "refunds.issue", {**REFUND, "amount_cents": 6000}, key, approval_id
    )
    assert swapped["outcome"] == "approval_mismatch", swapped

    done = cg(state, "wait", inv, "--session", alice)
    assert done["outcome"] == "executed", done
    assert done["result"]["order_id"] == "ORD-42" and done["result"]["amount_cents"] == 5000

    # V2: the approved call resubmitted with its key and approval, and the key alone: replays
    for again in (
        propose(state, alice, "refunds.issue", REFUND, key, approval_id),
        propose(state, alice, "refunds.issue", REFUND, key=key),
    ):
        assert again["outcome"] == "replayed", again
        assert again["result"] == done["result"]
        assert again["replay_of"]["invocation_id"] == inv

    effects = [e for e in cg(state, "effects") if e["target"] == "ORD-42"]
    assert len(effects) == 1, effects
    assert effects[0]["tool"] == "refunds.issue"
    assert effects[0]["invocation_id"] == inv

    records = cg(state, "audit", "--session", ops(state), "--invocation", inv)
    assert records and all(r["proposed_by"] == "model" for r in records)
    auth = records[-1]["authorized_by"]
    assert records[-1]["outcome"] == "executed"
    assert auth["decision"] == "permit" and auth["principal"]["user"] == "alice"
    assert auth["approval"]["approved_invocation_id"] == inv
    assert auth["approval"]["approver"] == "alice"

    everything = cg(state, "audit", "--session", ops(state))
    verified = cg(state, "audit", "verify")
    assert verified["ok"] is True and verified["records"] == len(everything) >= 4
    replayed = cg(state, "replay")
    assert replayed["equal"] is True and replayed["events"] > 0
    assert cg(state, "status", inv, "--session", ops(state))["outcome"] == "executed"


def test_denied_calls_never_reach_a_provider(state: Path) -> None:
    """C1, C12: policy denial is ``tool_forbidden`` with no dry-run and no execution;
    docs/contract.md "Confirmation": the actor may not approve their own high-impact (C4) refund,
    which ``approve`` reports as a coded JSON error and exit 1."""
    alice = session(state, "alice", "acme", "support,finance-approver")
    bob = session(state, "bob", "acme", "finance-approver")
    gabe = session(state, "gabe", "globex", "finance-approver")
    created = propose(state, alice, "tickets.create", {"title": "t", "requester_id": "alice"})
    assert created["outcome"] == "executed"
    before = cg(state, "effects")
    assert len(before) == 1

    denied = propose(state, alice, "deploys.trigger", DEPLOY)
    assert denied["outcome"] == "tool_forbidden" and denied["error"]["code"] == "tool_forbidden"
    assert cg(state, "effects") == before
    assert not PROVIDER_EVENTS & set(logged_event_types(state, denied["invocation_id"]))
    [record] = cg(state, "audit", "--session", ops(state), "--invocation", denied["invocation_id"])
    assert record["authorized_by"]["decision"] == "deny"

    big = propose(state, alice, "refunds.issue", BIG_REFUND, key="refund-ORD-77")
    assert big["outcome"] == "approval_required"
    inv = big["invocation_id"]
    [pending] = [
        p for p in cg(state, "pending", "--session", ops(state)) if p["invocation_id"] == inv
    ]
    assert pending["confirmation"] == "approver"

    # the actor themself; an approver of another tenant, for whom the invocation does not
    # exist (tenant-scoped identifiers, docs/contract.md)
    for who, code in ((alice, "approver_forbidden"), (gabe, "not_pending")):
        refused = run(state, "approve", inv, "--session", who, rc=EXIT_FAILED).value
        assert refused["error"]["code"] == code, refused
        assert refused["error"]["message"]
        assert "approval_id" not in refused
    assert inv in {
        p["invocation_id"] for p in cg(state, "pending", "--session", ops(state))
    }  # still waiting

    granted = cg(state, "approve", inv, "--session", bob)  # the right approver may
    assert granted["invocation_id"] == inv and granted["approval_id"]
    assert granted["outcome"] == "executed"  # and the approved call runs (ADR 0029)
    assert len(cg(state, "effects")) == len(before) + 1


def _short_ttl_profile(tmp_path: Path, ttl_seconds: int) -> Path:
    """A copy of the shipped profile whose refunds approvals live ``ttl_seconds``."""
    folder = tmp_path / "profile"
    folder.mkdir()
    doc = yaml.safe_load(DEFAULT_PROFILE.read_text())
    shutil.copy(DEFAULT_PROFILE.parent / doc["policy_file"], folder / doc["policy_file"])
    doc["tools"]["refunds.issue"]["approval_ttl_seconds"] = ttl_seconds
    doc["tools"]["refunds.issue"]["continue_on_approval"] = False  # the agent resubmits
    path = folder / "short-ttl.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_an_expired_approval_fails_closed(state: Path, tmp_path: Path) -> None:
    """C11: an approval used after it expired is ``approval_expired`` and nothing runs.

    The TTL is 6 s: ``approve`` is a fresh Python process and must reach the decider
    before the *pending* request (same TTL) expires, even on a loaded machine.
    """
    profile = _short_ttl_profile(tmp_path, ttl_seconds=6)
    assert cg(state, "catalog", profile=profile)  # the copy loads
    alice = session(state, "alice", "acme", "support")
    first = propose(state, alice, "refunds.issue", REFUND, key="K-exp", profile=profile)
    assert first["outcome"] == "approval_required"
    approval = cg(state, "approve", first["invocation_id"], "--session", alice, profile=profile)
    assert approval["expires_at"] - now_ms() <= 6_000

    while now_ms() <= approval["expires_at"] + 100:
        time.sleep(0.1)
    late = propose(state, alice, "refunds.issue", REFUND, "K-exp", approval["approval_id"], profile)
    assert late["outcome"] == "approval_expired", late
    assert late["error"]["code"] == "approval_expired"
    assert cg(state, "effects", profile=profile) == []
    assert not {"ExecutionRequested", "ExecutionStarted"} & set(
        logged_event_types(state, late["invocation_id"])
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus", "catalog"], "unrecognized arguments: --bogus"),
        (["frobnicate"], "invalid choice"),
        (["propose", "--tool", "tickets.read", "--args", "{}"], "--session"),
        (["--profile", "/nonexistent/profile.yaml", "catalog"], "/nonexistent/profile.yaml"),
    ],
)
def test_misuse_exits_2_with_a_message_and_no_traceback(
    state: Path, argv: list[str], message: str
) -> None:
    """docs/contract.md "Command line": misuse exits 2 with a clear message: on stderr for
    people, as the one JSON value ``{"error": {"code": "usage"}}`` with ``--json``."""
    human = run(state, *argv, rc=EXIT_MISUSE, json_mode=False)
    assert message in human.stderr and "callgate: error:" in human.stderr
    assert human.stdout == ""  # nothing a script could mistake for an answer
    coded = run(state, *argv, rc=EXIT_MISUSE)
    assert coded.value["error"]["code"] == "usage", coded
    assert message in coded.value["error"]["message"]


@pytest.mark.parametrize(
    ("args", "message"),
    [("{bad", "arguments are not valid JSON"), ("[1, 2]", "--args must be a JSON object")],
)
def test_malformed_args_json_is_misuse_and_publishes_nothing(
    state: Path, args: str, message: str
) -> None:
    """Misuse is refused before anything is published: no invocation, no effect."""
    alice = session(state, "alice", "acme", "support")
    result = run(state, *propose_argv(alice, "tickets.read", args), rc=EXIT_MISUSE)
    assert result.value["error"]["code"] == "usage"
    assert message in result.value["error"]["message"]
    assert cg(state, "audit", "--session", ops(state)) == []


@pytest.mark.parametrize("bad_profile", ["missing.yaml", "."])
def test_unreadable_profile_on_propose_publishes_nothing(
    state: Path, tmp_path: Path, bad_profile: str
) -> None:
    """An unreadable ``--profile`` is misuse (exit 2) and must not leave the call in the
    log for a later run to execute (a script that saw exit 2 assumes nothing happened)."""
    alice = session(state, "alice", "acme", "support")
    ticket = {"title": "ghost", "requester_id": "alice"}
    argv = propose_argv(alice, "tickets.create", json.dumps(ticket))
    result = run(state, *argv, rc=EXIT_MISUSE, profile=tmp_path / bad_profile)
    error = result.value["error"]
    assert error["code"] == "usage" and "profile" in error["message"]
    # A later, correct call runs the deciders over whatever the log holds.
    assert propose(state, alice, "tickets.read", {"ticket_id": "T-1"})["outcome"] == "executed"
    assert cg(state, "effects") == []
    assert [r["tool"] for r in cg(state, "audit", "--session", ops(state))] == ["tickets.read"]


def test_demo_walks_the_contract(tmp_path: Path) -> None:
    """``callgate demo --json``: every step of the walk-through gets its expected outcome."""
    report = cg(tmp_path / "state", "demo")
    assert report["steps"] and all(step["ok"] for step in report["steps"]), report
    assert report["audit_ok"] is True and report["audit_records"] > 0
    expected = {step["expected"] for step in report["steps"]}
    assert {"identity_spoof", "approval_mismatch", "replayed"} <= expected  # V1, V2


def test_clients_only_append_and_poll_while_serve_holds_the_lock(
    state: Path, tmp_path: Path
) -> None:
    """docs/contract.md "Command line" (``callgate serve``): with a server running, ``propose`` only
    publishes and polls (it cannot take the runner lock), and the server settles the call;
    SIGTERM stops the server cleanly."""
    alice = session(state, "alice", "acme", "support")
    serve = Serve(state, tmp_path / "serve.log")
    try:
        serve.wait_serving()
        assert runner_lock_held(state)
        read = propose(state, alice, "tickets.read", {"ticket_id": "T-9"})
        created = propose(
            state, alice, "tickets.create", {"title": "via serve", "requester_id": "alice"}, "k1"
        )
        assert read["outcome"] == "executed" and created["outcome"] == "executed"

        # Freeze the server: the client times out unsettled instead of deciding itself.
        serve.freeze(state)
        try:
            argv = propose_argv(alice, "tickets.read", '{"ticket_id": "T-10"}')
            stuck = run(state, *argv, "--timeout", "1", rc=EXIT_FAILED)
        finally:
            serve.thaw()
        assert stuck.value["settled"] is False and stuck.value["outcome"] in VOCABULARY
        inv = stuck.value["invocation_id"]
        deadline = time.monotonic() + 20
        while not (status := run(state, "status", inv, "--session", ops(state), rc=None).value).get(
            "settled"
        ):
            assert time.monotonic() < deadline, f"serve never settled the call: {status}"
            time.sleep(0.2)  # not_found (exit 1) until the thawed server has decided
        assert status["outcome"] == "executed"
        [effect] = cg(state, "effects")
        assert effect["invocation_id"] == created["invocation_id"]
    finally:
        code = serve.stop()
    assert code == 0
    assert not runner_lock_held(state)  # released on SIGTERM


def test_answers_use_the_vocabulary(state: Path) -> None:
    """docs/contract.md "Vocabulary": ``outcome`` is always one code; errors carry it."""
    alice = session(state, "alice", "acme", "support")
    answers: list[dict[str, Any]] = [
        propose(state, alice, "nope.tool", {}),
        propose(state, alice, "tickets.read", {"ticket_id": ""}),
        propose(state, "not-a-token", "tickets.read", {"ticket_id": "T-1"}),
    ]
    assert [a["outcome"] for a in answers] == [
        "unknown_tool",
        "invalid_arguments",
        "unauthenticated",
    ]
    assert all(a["error"]["code"] == a["outcome"] for a in answers)


# --- exact identifiers, one strict reader, one refusal shape (issue 25) ---------------------


@pytest.mark.parametrize(
    ("tenant", "roles", "tool", "args", "code"),
    [
        ("ACME", "support", "tickets.read", {"ticket_id": "T-1"}, "tool_forbidden"),
        ("Acme", "support", "tickets.read", {"ticket_id": "T-1"}, "tool_forbidden"),
        ("acme ", "support", "tickets.read", {"ticket_id": "T-1"}, "unauthenticated"),
        ("\uff41\uff43\uff4d\uff45", "support", "tickets.read", {"ticket_id": "T-1"},
         "tool_forbidden"),
        ("acme", "ADMIN", "users.delete", {"user_id": "U-1"}, "tool_forbidden"),
        ("acme", "Admin", "users.delete", {"user_id": "U-1"}, "tool_forbidden"),
        ("acme", " admin", "users.delete", {"user_id": "U-1"}, "unauthenticated"),
    ],
)  # fmt: skip
def test_other_spellings_of_tenant_and_role_get_nothing(
    state: Path, tenant: str, roles: str, tool: str, args: dict[str, Any], code: str
) -> None:
    token = session(state, "ivan", tenant, roles)
    answer = propose(state, token, tool, args)
    assert answer["outcome"] == code, answer
    assert "claim" in answer["error"]["message"] or code != "unauthenticated"
    assert cg(state, "effects") == []


@pytest.mark.parametrize(
    "args",
    [
        '{"ticket_id": "GT-1", "ticket_id": "T-1"}',
        '{"ticket_id": "GT-1", "ticket\\u005fid": "T-1"}',
    ],
)
def test_duplicate_keys_in_args_are_misuse_and_publish_nothing(state: Path, args: str) -> None:
    alice = session(state, "alice", "acme", "support")
    result = run(state, *propose_argv(alice, "tickets.read", args), rc=EXIT_MISUSE)
    assert result.value["error"]["code"] == "usage"
    assert "duplicate key 'ticket_id'" in result.value["error"]["message"]
    assert cg(state, "audit", "--session", ops(state)) == []


def test_a_refusal_before_publishing_answers_like_a_decided_one(state: Path) -> None:
    """Over a limit (here nesting): the answer of a refused call, outcome equal to the
    error's code, exit 0 like a decided refusal; nothing is published."""
    alice = session(state, "alice", "acme", "support")
    deep = '{"record_id": "REC-1", "fields": ' + '{"d": ' * 12 + "1" + "}" * 12 + "}"
    answer = run(state, *propose_argv(alice, "records.update", deep), rc=EXIT_OK).value
    assert answer["outcome"] == answer["error"]["code"] == "invalid_arguments", answer
    assert answer["invocation_id"] is None
    decided = propose(state, alice, "tickets.read", {"ticket_id": "GT-1"})
    assert decided["outcome"] == decided["error"]["code"] == "tool_forbidden"


def test_an_approver_under_a_look_alike_of_the_actor_is_refused(state: Path) -> None:
    rita = session(state, "rita", "acme", "release,release-manager")
    deploy = {"service": "billing", "version": "3.0.0", "environment": "production"}
    inv = propose(state, rita, "deploys.trigger", deploy)["invocation_id"]
    for look_alike in ("Rita", "\uff52\uff49\uff54\uff41", "r\u0456ta"):
        other = session(state, look_alike, "acme", "release-manager")
        refused = run(state, "approve", inv, "--session", other, rc=EXIT_FAILED).value
        assert refused["error"]["code"] == "approver_forbidden", refused
        assert "look-alike" in refused["error"]["message"]


def test_propose_wait_answers_final_also_for_a_call_final_at_once(state: Path) -> None:
    """``propose --wait`` prints the waited shape (``final``) whether the call needed an
    approval or was final when first seen (on Kafka an approval can land before the
    agent's first read)."""
    alice = session(state, "alice", "acme", "support")
    argv = propose_argv(alice, "tickets.read", json.dumps({"ticket_id": "T-1"}))
    answer = cg(state, *argv, "--wait", "5s")
    assert answer["outcome"] == "executed" and answer["final"] is True, answer
