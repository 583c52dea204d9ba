"""The kernel's file-size limit (``RLIMIT_FSIZE``) as a full disk (ADR 0084), on the
installed command: no root, no filesystem of its own.

A process past its limit gets EFBIG for every write that would grow a file (Python ignores
SIGXFSZ, which would otherwise end it), and SQLite reports that as a disk I/O error. The
command line under the limit answers ``storage_unavailable`` (exit 1, no traceback) and
records nothing; a running ``callgate serve --http`` whose limit is lowered
(``prlimit``) answers ``503 storage_unavailable``, leaves the calls recorded meanwhile
undecided, and decides them by itself once the limit is lifted. ``audit verify`` and
``replay`` hold afterwards. ``tests/integration/test_disk_full.py`` fills a real filesystem.
"""

from __future__ import annotations

import json
import resource
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tools.ports import free_port

from tests.e2e.helpers import (
    EXIT_FAILED,
    callgate_argv,
    cg,
    cli_env,
    propose_argv,
    run,
    session,
)

pytestmark = pytest.mark.e2e

READ = ("--tool", "tickets.read", "--args", '{"ticket_id": "T-1"}')


def no_file_may_grow() -> None:
    """In the child, before it runs: any write that grows a file fails (EFBIG)."""
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))


def test_the_command_line_past_its_file_size_limit_answers_storage_unavailable(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    token = session(state, "alice", "acme", "support")
    first = cg(state, "propose", "--session", token, *READ)
    assert first["outcome"] == "executed"
    limited = subprocess.run(
        [
            *callgate_argv(),
            "--json",
            "--state-dir",
            str(state),
            "propose",
            "--session",
            token,
            *READ,
        ],
        capture_output=True,
        text=True,
        env=cli_env(),
        preexec_fn=no_file_may_grow,
        timeout=60,
    )
    assert limited.returncode == EXIT_FAILED, limited
    assert "Traceback" not in limited.stderr, limited.stderr
    error = json.loads(limited.stdout)["error"]
    assert error["code"] == "storage_unavailable", error
    assert "SQLITE_IOERR" in error["message"], error  # EFBIG, as SQLite reports it
    audit = cg(state, "audit", "--session", session(state, "op", "ops", "callgate-operator"))
    assert len({row["invocation_id"] for row in audit}) == 1  # nothing of it was recorded
    again = cg(state, "propose", "--session", token, *READ)
    assert again["outcome"] == "executed"
    assert cg(state, "audit", "verify")["ok"] is True


def test_serve_started_past_its_limit_stops_with_storage_unavailable(tmp_path: Path) -> None:
    """It cannot mark the store in use: it says so with the code and stops; with room
    again, the state directory serves calls."""
    state = tmp_path / "state"
    token = session(state, "alice", "acme", "support")
    assert cg(state, "propose", "--session", token, *READ)["outcome"] == "executed"
    started = subprocess.run(
        [*callgate_argv(), "--json", "--state-dir", str(state), "serve"],
        capture_output=True,
        text=True,
        env=cli_env(),
        preexec_fn=no_file_may_grow,
        timeout=60,
    )
    assert started.returncode == EXIT_FAILED, started
    assert "Traceback" not in started.stderr, started.stderr
    assert json.loads(started.stdout)["error"]["code"] == "storage_unavailable", started
    again = cg(state, "propose", "--session", token, *READ)
    assert again["outcome"] == "executed"


@pytest.fixture
def http_serve_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """``callgate serve --http`` on a state directory of its own; its stderr lines (a
    pipe: the limit does not apply to it)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *callgate_argv(),
            "--state-dir",
            str(tmp_path / "state"),
            "--log-format",
            "json",
            "serve",
            "--http",
            f"127.0.0.1:{port}",
        ],
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    stderr = proc.stderr
    reader = threading.Thread(target=lambda: lines.extend(stderr), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, lines
        time.sleep(0.2)
    try:
        yield proc, url, lines
    finally:
        proc.terminate()
        proc.wait(30)
        reader.join(10)


def test_a_running_server_past_its_file_size_limit_refuses_and_resumes_by_itself(
    tmp_path: Path, http_serve_process: tuple[subprocess.Popen[str], str, list[str]]
) -> None:
    proc, url, lines = http_serve_process
    state = tmp_path / "state"
    token = session(state, "alice", "acme", "support")
    headers = {"Authorization": f"Bearer {token}"}
    body = {"tool": "tickets.read", "args": {"ticket_id": "T-1"}}
    assert (
        httpx.post(f"{url}/v1/proposals", json=body, headers=headers, timeout=60).json()["outcome"]
        == "executed"
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)  # the server's, inherited
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (0, hard))
    try:
        refused = httpx.post(f"{url}/v1/proposals", json=body, headers=headers, timeout=60)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "storage_unavailable"
        # Appended by the command line (not limited): recorded, not decided meanwhile.
        args = propose_argv(token, "tickets.read", '{"ticket_id": "T-2"}')
        answer = run(state, "--timeout", "3", *args, rc=None).value
        assert answer["outcome"] == "pending_decision", answer
    finally:
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (soft, hard))
    deadline = time.monotonic() + 30
    status: dict[str, object] = {}
    while status.get("outcome") != "executed":
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
        status = cg(state, "status", answer["invocation_id"], "--session", token)
    assert proc.poll() is None  # serve went on by itself
    events = [json.loads(line).get("event") for line in lines if line.startswith("{")]
    assert "storage_unavailable" in events and "storage_recovered" in events, lines
    assert not [line for line in lines if "Traceback" in line], lines
    assert cg(state, "audit", "verify")["ok"] is True
    assert cg(state, "replay")["equal"] is True
