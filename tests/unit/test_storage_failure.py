"""A disk that refuses a write (ADR 0084), told apart from every other failure.

The errors are real: SQLite's own page limit answers SQLITE_FULL, ``/dev/full`` answers
ENOSPC, and a child process under the kernel's file-size limit (``RLIMIT_FSIZE``, with
SIGXFSZ ignored as Python does) meets EFBIG, which SQLite reports as a disk I/O error.
"""

from __future__ import annotations

import errno
import io
import json
import resource
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from callgate.adapters.embedded.full_disk import RETRY_MAX_S, retry_delay
from callgate.domain.codes import Code, storage_failure
from callgate.logs import StorageLog, serve_line
from callgate.surfaces.cli import classify
from callgate.surfaces.commands.context import EXIT_FAILED

REPO = Path(__file__).resolve().parents[2]


def full_device_error() -> OSError:
    """ENOSPC, as a write to a full disk gets it."""
    with pytest.raises(OSError) as caught, open("/dev/full", "wb", buffering=0) as full:
        full.write(b"x")
    return caught.value


def sqlite_full_error(tmp_path: Path) -> sqlite3.Error:
    """SQLITE_FULL: a database that may not grow by another page."""
    conn = sqlite3.connect(tmp_path / "full.sqlite3")
    conn.execute("CREATE TABLE t (x BLOB)")
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(sqlite3.Error) as caught:
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))
    conn.close()
    return caught.value


def under_file_size_limit(tmp_path: Path, code: str) -> str:
    """Run ``code`` in a child whose files may not grow past 64 KiB; its stdout."""
    limit = 64 * 1024

    def limited() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))

    paths = [REPO / "services", REPO / "projections", REPO]
    env = {"PYTHONPATH": ":".join(str(p) for p in paths), "PYTHONDONTWRITEBYTECODE": "1"}
    run = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=limited,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_a_full_disk_is_a_storage_failure(tmp_path: Path) -> None:
    assert storage_failure(full_device_error()) == "ENOSPC: No space left on device"
    assert storage_failure(sqlite_full_error(tmp_path)) == ("SQLITE_FULL: database or disk is full")


def test_the_file_size_limit_is_a_storage_failure_in_sqlite_and_in_a_file(
    tmp_path: Path,
) -> None:
    found = json.loads(
        under_file_size_limit(
            tmp_path,
            """
            import json, sqlite3
            from callgate.domain.codes import storage_failure
            seen = {}
            conn = sqlite3.connect("db.sqlite3")
            conn.execute("CREATE TABLE t (x BLOB)")
            try:
                conn.execute("INSERT INTO t VALUES (?)", (b"x" * 200_000,))
                conn.commit()
            except sqlite3.Error as exc:
                seen["sqlite"] = storage_failure(exc)
            try:
                with open("big", "wb") as f:
                    f.write(b"x" * 200_000)
            except OSError as exc:
                seen["file"] = storage_failure(exc)
            print(json.dumps(seen))
            """,
        )
    )
    assert found == {
        "sqlite": "SQLITE_IOERR_WRITE: disk I/O error",
        "file": "EFBIG: File too large",
    }


def test_a_busy_database_and_other_errors_are_not(tmp_path: Path) -> None:
    path = tmp_path / "busy.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError) as busy:
        other.execute("BEGIN IMMEDIATE")
    holder.rollback()
    other.close()
    holder.close()
    with pytest.raises(sqlite3.ProgrammingError) as closed:
        holder.execute("SELECT 1")
    with pytest.raises(FileNotFoundError) as missing:
        (tmp_path / "nothing").read_bytes()
    for exc in (busy.value, closed.value, missing.value, ValueError("x"), TimeoutError()):
        assert storage_failure(exc) is None, exc


def test_the_command_line_reports_it_as_storage_unavailable() -> None:
    code, message, exit_code = classify(full_device_error())
    assert (code, exit_code) == (Code.STORAGE_UNAVAILABLE, EXIT_FAILED)
    assert message == "the disk refused a write: ENOSPC: No space left on device"


def test_refused_rounds_are_tried_again_sooner_than_a_second_apart_and_less_often() -> None:
    delays = [retry_delay(attempt) for attempt in range(1, 40)]
    assert delays[0] == 0.05
    assert delays == sorted(delays)
    assert max(delays) == RETRY_MAX_S == 1.0


def test_serve_says_once_that_the_disk_refuses_and_once_that_it_takes_writes_again(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = StorageLog("json", every_s=30.0)
    log.refused("SQLITE_FULL: database or disk is full", 1, 0.05)
    log.refused("SQLITE_FULL: database or disk is full", 2, 0.1)  # within 30 s: quiet
    log.resumed(2, 1.25)
    log.refused("ENOSPC: No space left on device", 1, 0.05)  # a new outage is told again
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["event"] for line in lines] == [
        "storage_unavailable",
        "storage_recovered",
        "storage_unavailable",
    ]
    assert lines[0]["code"] == "storage_unavailable" and lines[0]["attempt"] == 1
    assert lines[1]["attempts"] == 2 and lines[1]["refused_s"] == 1.25


def test_a_log_line_that_cannot_be_written_is_lost_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Serve's stderr on the full disk: the line goes, serve stays."""
    full = io.TextIOWrapper(io.FileIO("/dev/full", "w"), write_through=True)
    try:
        with pytest.raises(OSError) as refused:
            full.write("the stream itself refuses\n")
        assert refused.value.errno == errno.ENOSPC
        monkeypatch.setattr(sys, "stderr", full)
        serve_line("text", "storage_unavailable", "the disk refused a write")
    finally:
        full.close()
