"""Development mode is explicit (ADR 0013): only ``--dev`` / ``CALLGATE_DEV=1`` trusts the
development issuer behind ``callgate session issue``.

The installed command as subprocesses on the embedded backend: ``serve`` without
development mode refuses a development token as ``unauthenticated``; ``session issue``
without it fails with a coded error; ``serve --dev`` says so on stderr.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import EXIT_FAILED, Serve, propose, run, session

pytestmark = pytest.mark.e2e


def test_session_issue_needs_development_mode(tmp_path: Path) -> None:
    refused = run(
        tmp_path, "session", "issue", "--user", "alice", "--tenant", "acme", dev=False,
        rc=EXIT_FAILED,
    )  # fmt: skip
    error = refused.value["error"]
    assert error["code"] == "development_mode_required"
    assert "--dev" in error["message"] and "CALLGATE_DEV=1" in error["message"]
    assert "token" not in refused.value


def test_serve_without_development_mode_refuses_a_development_token(tmp_path: Path) -> None:
    """The serving process decides, in its own mode: a development token minted by a
    ``--dev`` client is ``unauthenticated`` there, and no provider is called."""
    state = tmp_path / "state"
    alice = session(state, "alice", "acme", "support")  # a development-mode client
    serve = Serve(state, tmp_path / "serve.log", extra_env={"CALLGATE_DEV": "0"})
    try:
        serve.wait_serving()
        assert "development mode:" not in serve.log.read_text()
        assert "warning: no session issuer is configured" in serve.log.read_text()
        answer = propose(state, alice, "tickets.read", {"ticket_id": "T-1"})
        assert answer["outcome"] == "unauthenticated", answer
        assert answer["error"]["message"] == (
            "development session token: development mode is off (use --dev or CALLGATE_DEV=1)"
        )
        assert run(state, "effects").value == []
    finally:
        assert serve.stop() == 0


def test_serve_in_development_mode_says_so_and_trusts_development_tokens(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    alice = session(state, "alice", "acme", "support")
    serve = Serve(state, tmp_path / "serve.log")  # CALLGATE_DEV=1 (the helpers' default)
    try:
        serve.wait_serving()
        [notice] = [
            line for line in serve.log.read_text().splitlines() if "development mode" in line
        ]
        assert notice.startswith("callgate: development mode:")
        answer = propose(state, alice, "tickets.read", {"ticket_id": "T-1"})
        assert answer["outcome"] == "executed", answer
    finally:
        assert serve.stop() == 0
