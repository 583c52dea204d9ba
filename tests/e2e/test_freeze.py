"""``callgate freeze`` / ``unfreeze`` (issue 29, part 4) on the embedded store, through the
command line: a freeze stops a tool on the running ``serve`` within the target and an
unfreeze restores it; an approval asked before the freeze does not continue; a session
without the operator role and malformed arguments are refused with codes, nothing logged.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from callgate.bootstrap import Settings
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.sdk import Gateway, connect
from tests.e2e.helpers import (
    EXIT_FAILED,
    EXIT_MISUSE,
    Serve,
    cg,
    logged_event_types,
    propose,
    run,
    session,
)

pytestmark = pytest.mark.e2e

TARGET_S = 1.0
TICKET = {"title": "printer on fire", "requester_id": "alice"}
BIG_REFUND = {"order_id": "ORD-77", "amount_cents": 25000, "currency": "EUR"}


def freeze_count(state: Path) -> int:
    """Freeze events on the log (the store, read directly: what was published)."""
    import sqlite3

    if not (state / "events.sqlite3").exists():
        return 0
    with sqlite3.connect(state / "events.sqlite3") as db:
        row = db.execute(
            "SELECT count(*) FROM log WHERE event_type IN ('FreezeApplied', 'FreezeLifted')"
        ).fetchone()
    return int(row[0])


class Prober:
    """Proposes ``tickets.create`` in a loop from this process (no start-up cost per call),
    noting when each answer came and its outcome, so enforcement is timed from the event."""

    def __init__(self, gate: Gateway, token: str) -> None:
        self.answers: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._gate, self._token = gate, token
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            answer = self._gate.propose(session=self._token, tool="tickets.create", args=TICKET)
            self.answers.append((time.time_ns() // 1_000_000, str(answer["outcome"])))

    def enforced_after(self, since_ms: int, outcome: str) -> float:
        """Seconds from ``since_ms`` to the first answer after it with ``outcome``."""
        deadline = time.monotonic() + 10 * TARGET_S
        while time.monotonic() < deadline:
            for at, seen in list(self.answers):
                if at >= since_ms and seen == outcome:
                    return (at - since_ms) / 1000
            time.sleep(0.01)
        raise AssertionError(f"never {outcome}: {self.answers[-5:]}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_a_freeze_stops_a_tool_on_serve_and_an_unfreeze_restores_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    operator = session(state, "olga", "ops", OPERATOR_ROLE)
    alice = session(state, "alice", "acme", "support")
    serve = Serve(state, tmp_path / "serve.log")
    gate = connect(Settings(state_dir=state, dev=True))
    try:
        serve.wait_serving()
        assert propose(state, alice, "tickets.create", TICKET)["outcome"] == "executed"
        prober = Prober(gate, alice)

        applied = cg(
            state, "freeze", "--tool", "tickets.create", "--reason", "incident 7",
            "--session", operator,
        )  # fmt: skip
        assert applied["event"] == "FreezeApplied" and applied["author"] == "olga"
        assert prober.enforced_after(applied["occurred_at"], "frozen") <= TARGET_S
        frozen = propose(state, alice, "tickets.create", TICKET)
        assert frozen["outcome"] == "frozen", frozen
        assert "incident 7" in frozen["error"]["message"]
        assert PROVIDER_TYPES.isdisjoint(logged_event_types(state, frozen["invocation_id"]))
        # Exact: another tool, and a look-alike name, are not frozen.
        assert propose(state, alice, "tickets.read", {"ticket_id": "T-1"})["outcome"] == "executed"

        lifted = cg(state, "unfreeze", "--tool", "tickets.create", "--session", operator)
        assert prober.enforced_after(lifted["occurred_at"], "executed") <= TARGET_S
    finally:
        prober.stop()
        gate.close()
        serve.stop()


PROVIDER_TYPES = {"DryRunRequested", "ExecutionRequested", "ExecutionStarted"}


def test_tenant_and_actor_freezes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    operator = session(state, "olga", "ops", OPERATOR_ROLE)
    alice = session(state, "alice", "acme", "support")
    gina = session(state, "gina", "globex", "support")

    def create(token: str, user: str) -> str:
        args = {"title": "t", "requester_id": user}
        return str(propose(state, token, "tickets.create", args)["outcome"])

    cg(state, "freeze", "--tenant", "acme", "--reason", "r", "--session", operator)
    assert (create(alice, "alice"), create(gina, "gina")) == ("frozen", "executed")
    cg(state, "unfreeze", "--tenant", "acme", "--session", operator)
    cg(state, "freeze", "--actor", "gina", "--reason", "r", "--session", operator)
    assert (create(alice, "alice"), create(gina, "gina")) == ("executed", "frozen")


def test_an_approval_asked_before_the_freeze_does_not_continue(tmp_path: Path) -> None:
    state = tmp_path / "state"
    operator = session(state, "olga", "ops", OPERATOR_ROLE)
    alice = session(state, "alice", "acme", "support")
    fiona = session(state, "fiona", "acme", "finance-approver")
    asked = propose(state, alice, "refunds.issue", {**BIG_REFUND, "issued_by": "alice"})
    assert asked["outcome"] == "approval_required", asked
    invocation = asked["invocation_id"]

    cg(state, "freeze", "--tool", "refunds.issue", "--reason", "audit", "--session", operator)
    run(state, "approve", invocation, "--session", fiona, rc=None)

    status = cg(state, "status", invocation, "--session", operator)
    assert status["outcome"] == "frozen", status
    assert "ExecutionRequested" not in logged_event_types(state, invocation)


@pytest.mark.parametrize(
    "argv",
    [
        ["freeze", "--tool", "tickets.create", "--reason", "r"],
        ["unfreeze", "--tool", "tickets.create"],
    ],
)
def test_a_session_without_the_operator_role_is_refused(tmp_path: Path, argv: list[str]) -> None:
    state = tmp_path / "state"
    alice = session(state, "alice", "acme", f"support,{OPERATOR_ROLE.upper()}")
    refused = run(state, *argv, "--session", alice, rc=EXIT_FAILED)
    assert '"operator_required"' in refused.stderr + refused.stdout
    assert freeze_count(state) == 0


@pytest.mark.parametrize(
    ("argv", "rc", "code"),
    [
        (["freeze", "--tool", "tickets.create"], EXIT_MISUSE, "usage"),  # no reason
        (["freeze", "--reason", "r"], EXIT_MISUSE, "usage"),  # nothing to freeze
        (["freeze", "--tool", "a", "--tenant", "b", "--reason", "r"], EXIT_MISUSE, "usage"),
        (["freeze", "--tool", "", "--reason", "r"], EXIT_FAILED, "invalid_request"),
        (["freeze", "--tool", " tickets.create", "--reason", "r"], EXIT_FAILED, "invalid_request"),
        (["freeze", "--tool", "tick\x07ets", "--reason", "r"], EXIT_FAILED, "invalid_request"),
        (["freeze", "--tool", "t" * 201, "--reason", "r"], EXIT_FAILED, "invalid_request"),
        (["freeze", "--tool", "tickets.create", "--reason", "  "], EXIT_FAILED, "invalid_request"),
    ],
)
def test_malformed_arguments_are_refused_and_publish_nothing(
    tmp_path: Path, argv: list[str], rc: int, code: str
) -> None:
    state = tmp_path / "state"
    operator = session(state, "olga", "ops", OPERATOR_ROLE)
    refused = run(state, *argv, "--session", operator, rc=rc)
    assert f'"{code}"' in refused.stderr + refused.stdout
    assert freeze_count(state) == 0


def test_the_http_api_answers_403_frozen_until_unfrozen(tmp_path: Path) -> None:
    """The HTTP surface is a translation of the same decision (ADR 0054)."""
    from tests.http_support import HttpServe

    serve = HttpServe(tmp_path / "state", tmp_path / "serve.log", dev=True)
    try:
        serve.wait_ready()
        operator = serve.token("olga", "ops", OPERATOR_ROLE)
        call = {"tool": "tickets.create", "args": TICKET}
        with serve.client(serve.token("alice", "acme", "support")) as c:
            cg(
                serve.state_dir,
                "freeze",
                "--actor",
                "alice",
                "--reason",
                "r",
                "--session",
                operator,
            )
            r = c.post("/v1/proposals", json=call)
            assert r.status_code == 403 and r.json()["error"]["code"] == "frozen", r.text
            cg(serve.state_dir, "unfreeze", "--actor", "alice", "--session", operator)
            r = c.post("/v1/proposals", json=call)
            assert r.status_code == 200 and r.json()["outcome"] == "executed", r.text
    finally:
        assert serve.stop() == 0, serve.log.read_text()
