"""Human output (no ``--json``) is for people: times as ISO-8601 UTC while JSON keeps epoch
milliseconds; progress (a spinner, a wait's lines) only on a terminal; tables that fit
the terminal, or print whole into a pipe or a file."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.unit.test_approvals import CLAIMS
from tools.bench import bench_table
from tools.bench_core import Row

from callgate.domain.approvals import ApprovalSigner, ApprovalVerifier
from callgate.domain.codes import Code, Rejection
from callgate.domain.keys import KeyRing
from callgate.surfaces.render import Renderer

MS = 1_796_613_368_328  # a time as the events and JSON hold it
ISO = datetime.fromtimestamp(MS / 1000, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"
SPINNER = re.compile("[\u2800-\u28ff]")  # rich's default spinner draws braille dots
LONG_ID = "f" * 64 + "." + "e" * 64  # a session-bound invocation id: 129 characters


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "callgate.surfaces.cli", *args]


PENDING = {
    "invocation_id": "i-1", "tool": "refunds.issue", "tenant": "acme", "actor": "alice",
    "args": {}, "dry_run": {}, "confirmation": "approver", "expires_at": MS,
}  # fmt: skip
HISTORY = {
    "active": "v1",
    "shadow": None,
    "history": [
        {"at": MS, "action": "activated", "version": "v1", "author": "op", "tenant": "acme",
         "reason": "r"}
    ],
}  # fmt: skip


def shown(capsys: pytest.CaptureFixture[str], json_mode: bool) -> list[str]:
    """What each time-bearing render prints, one string per render."""
    out = Renderer(json_mode)
    renders: list[Any] = [
        lambda: out.approval({"approval_id": "a-1", "invocation_id": "i-1", "expires_at": MS}),
        lambda: out.pending([PENDING]),
        lambda: out.status(
            {"invocation_id": "i-1", "updated_at": MS, "approval": {"expires_at": MS}}
        ),
        lambda: out.record({"event": "FreezeSet", "occurred_at": MS}),
        lambda: out.policy_history(HISTORY),
    ]
    printed = []
    for render in renders:
        render()
        printed.append(capsys.readouterr().out)
    return printed


def test_human_output_prints_times_as_iso_8601_utc(capsys: pytest.CaptureFixture[str]) -> None:
    for printed in shown(capsys, json_mode=False):
        assert ISO in printed, printed
        assert str(MS) not in printed, printed


def test_json_output_keeps_epoch_milliseconds(capsys: pytest.CaptureFixture[str]) -> None:
    """JSON is an API: the same renders keep the numbers."""
    for printed in shown(capsys, json_mode=True):
        json.loads(printed)
        assert str(MS) in printed and ISO not in printed, printed


def test_an_expired_approval_says_when_in_iso_8601() -> None:
    """The refusal's message is for people; its details keep the number."""
    ring = KeyRing.generate()
    approval_id = ApprovalSigner(ring.approval_signing_key, ring.approval_kid).sign(CLAIMS)
    verifier = ApprovalVerifier(ring.approval_verification_keys())
    with pytest.raises(Rejection) as refused:
        verifier.verify(approval_id, CLAIMS.expires_at + 1)
    assert refused.value.code is Code.APPROVAL_EXPIRED
    when = datetime.fromtimestamp(CLAIMS.expires_at / 1000, UTC)
    assert when.strftime("%Y-%m-%dT%H:%M:%S") in refused.value.message
    assert str(CLAIMS.expires_at) not in refused.value.message
    assert refused.value.details["expires_at"] == str(CLAIMS.expires_at)


@pytest.fixture(scope="module")
def state_with_a_call(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state directory whose log holds one settled call."""
    state = tmp_path_factory.mktemp("state")
    run = [*cli("--dev", "--state-dir", str(state))]
    issued = subprocess.run(
        [*run, "session", "issue", "--user", "alice", "--tenant", "acme", "--roles", "support"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    args = ["--tool", "tickets.read", "--args", '{"ticket_id": "T-1"}']
    propose = [*run, "propose", "--session", issued.stdout.strip(), *args]
    subprocess.run(propose, capture_output=True, check=True, timeout=120)
    return state


def test_replay_into_a_pipe_shows_no_spinner(state_with_a_call: Path) -> None:
    done = subprocess.run(
        cli("--state-dir", str(state_with_a_call), "replay"),
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done
    both = done.stdout + done.stderr
    assert not SPINNER.search(both) and "\r" not in both and "\x1b" not in both, both
    assert done.stderr == ""
    assert done.stdout.startswith("views rebuilt from "), done.stdout


def test_replay_on_a_terminal_shows_its_spinner(state_with_a_call: Path) -> None:
    """The same command with stderr on a terminal: the spinner is there (so the test
    above would see one if it were drawn into a pipe)."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            cli("--state-dir", str(state_with_a_call), "replay"),
            stdout=subprocess.PIPE, stderr=follower, text=True, timeout=120, check=False,
        )  # fmt: skip
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # EIO: the terminal's other side is closed
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
    assert done.returncode == 0, done
    assert SPINNER.search(drawn.decode(errors="replace")), drawn[-500:]
    assert "\r" not in done.stdout and not SPINNER.search(done.stdout)


def test_a_wait_shows_its_lines_only_on_a_terminal() -> None:
    """``propose --wait`` and ``callgate wait`` draw a line per change on a terminal only:
    here stderr is captured, so nothing is drawn."""
    assert Renderer(json_mode=False).progress("i-1", 60.0) is None
    assert Renderer(json_mode=True).progress("i-1", 60.0) is None


def test_tables_into_a_pipe_print_every_cell_whole(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a terminal, no ``COLUMNS``: no cell folded at 80 columns, one line per row."""
    monkeypatch.delenv("COLUMNS", raising=False)
    out = Renderer(json_mode=False)
    effect = {"seq": 1, "tool": "refunds.issue", "target": "ORD-7", "tenant": "acme"}
    out.effects([effect | {"invocation_id": LONG_ID, "token": "xk-" + "a" * 40}])
    note = "a note of the bench that is longer than eighty columns, " * 3
    row = Row("agent: propose p50, through callgate mcp --http", "1.2 ms", "≤ 5 ms", True, note)
    info = {"date": "2026-12-05", "cpu": "cpu", "cores": 2, "memory": "8 GB", "python": "3.11"}
    out.value({}, lambda c: c.print(bench_table(info, [row], quick=False)))
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if LONG_ID in line or note.strip() in line]
    assert len(rows) == 2, printed
    assert max(map(len, printed.splitlines())) > 200  # as wide as its widest row


def test_tables_fit_the_width_a_terminal_gives(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``COLUMNS`` (a terminal's width, or a script's choice) the table fits it."""
    monkeypatch.setenv("COLUMNS", "80")
    out = Renderer(json_mode=False)
    effect = {"seq": 1, "tool": "refunds.issue", "target": "ORD-7", "tenant": "acme"}
    out.effects([effect | {"invocation_id": LONG_ID, "token": "xk-" + "a" * 40}])
    printed = capsys.readouterr().out
    assert max(map(len, printed.splitlines())) <= 80, printed
    assert "refunds.issue" in printed.split()  # a tool name is never cut
