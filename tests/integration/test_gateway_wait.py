"""``Gateway.propose`` with ``wait`` answers in one shape (ADR 0029), whether the call is
final when first seen or becomes final while waited on."""

from __future__ import annotations

from pathlib import Path

from callgate.bootstrap import Settings, bootstrap


def test_a_waited_call_that_is_final_at_once_says_so(tmp_path: Path) -> None:
    app = bootstrap(Settings(state_dir=tmp_path, dev=True))
    gate = app.gateway()
    try:
        alice = app.session_issuer.issue("alice", "acme", ("support",), app.clock())
        answer = gate.propose(alice, "tickets.read", {"ticket_id": "T-1"}, wait=5)
    finally:
        gate.close()
    assert answer["outcome"] == "executed" and answer["final"] is True, answer
