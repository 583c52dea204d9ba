"""Opening a SQLite file that several processes share, in WAL mode.

``PRAGMA journal_mode = WAL`` on a fresh file can answer "database is locked" at once,
without waiting for the busy timeout, while another process converts the same file: two
``callgate serve`` instances starting on one state directory race exactly there. Opening
retries that answer until the busy timeout has passed; every other error is raised.
"""

from __future__ import annotations

import os
import sqlite3
import time

_RETRY_S = 0.005


def connect_wal(
    path: str | os.PathLike[str], *, busy_timeout_ms: int, synchronous: str
) -> sqlite3.Connection:
    """A connection in autocommit mode (we issue ``BEGIN IMMEDIATE``), WAL, ``synchronous``."""
    deadline = time.monotonic() + busy_timeout_ms / 1000
    conn = sqlite3.connect(
        path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                    raise
                time.sleep(_RETRY_S)
        conn.execute(f"PRAGMA synchronous = {synchronous}")
    except BaseException:
        conn.close()
        raise
    return conn
