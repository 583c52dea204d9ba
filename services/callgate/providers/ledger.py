"""The durable effect ledger of the bundled simulated providers (C12, docs/contract.md "Providers").

One SQLite file (``<state_dir>/effects.sqlite``) holds two tables:

- ``effects``: every side effect a simulated provider applied, append-only. This is the
  ground truth that tests and ``callgate effects`` use to prove "exactly one side effect",
  and what ``Provider.lookup`` reads to reconcile an uncertain outcome.
- ``world``: the small current state the simulations need (record fields, refunded totals,
  deployed versions, ...), keyed by a tuple of strings.

An effect row and the world changes it causes commit in one transaction, so the ledger
never shows an effect whose world change is missing (or the reverse). Several processes
may write at once: every write transaction is ``BEGIN IMMEDIATE`` (take the write lock
before reading, so read-modify-write cannot lose an update) with a busy timeout, and the
file is in WAL mode so readers never block the writer.

Connections are per thread and per process (a forked child opens its own; SQLite
connections must not cross a fork).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from callgate.sqlite import connect_wal

LEDGER_FILE = "effects.sqlite"
BUSY_TIMEOUT_MS = 30_000

_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS effects (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        provider TEXT NOT NULL,
        tool TEXT NOT NULL,
        target TEXT NOT NULL,
        tenant TEXT NOT NULL,
        token TEXT NOT NULL,
        invocation_id TEXT NOT NULL,
        args_json TEXT NOT NULL,
        result_json TEXT NOT NULL,
        applied_at INTEGER NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS effects_token ON effects (token)",
    "CREATE INDEX IF NOT EXISTS effects_invocation ON effects (invocation_id)",
    "CREATE TABLE IF NOT EXISTS world (key TEXT PRIMARY KEY, value_json TEXT NOT NULL)",
)

_COLUMNS = (
    "seq, provider, tool, target, tenant, token, invocation_id, args_json, result_json, applied_at"
)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _world_key(key: tuple[str, ...]) -> str:
    # A JSON array is unambiguous whatever the parts contain ("/", tenants with dots, ...).
    return json.dumps(list(key), separators=(",", ":"), ensure_ascii=False)


def _row_to_effect(row: tuple[Any, ...]) -> dict[str, Any]:
    seq, provider, tool, target, tenant, token, invocation_id, args_json, result_json, at = row
    return {
        "seq": seq,
        "provider": provider,
        "tool": tool,
        "target": target,
        "tenant": tenant,
        "token": token,
        "invocation_id": invocation_id,
        "args": json.loads(args_json),
        "result": json.loads(result_json),
        "applied_at": at,
    }


class WorldTxn:
    """World-state access inside one ``BEGIN IMMEDIATE`` transaction of the ledger."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def get(self, key: tuple[str, ...]) -> Any | None:
        row = self._conn.execute(
            "SELECT value_json FROM world WHERE key = ?", (_world_key(key),)
        ).fetchone()
        return None if row is None else json.loads(row[0])

    def put(self, key: tuple[str, ...], value: Any) -> None:
        self._conn.execute(
            "INSERT INTO world (key, value_json) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value_json = excluded.value_json",
            (_world_key(key), _canonical(value)),
        )


EffectFn = Callable[[WorldTxn], Mapping[str, Any]]


class EffectLedger:
    """Durable, multi-process effect ledger plus world state (see module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock_ms: Callable[[], int] = _wall_clock_ms,
        synchronous: str = "NORMAL",
    ) -> None:
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock_ms = clock_ms
        self._synchronous = synchronous
        self._local = threading.local()
        self._all: list[tuple[int, sqlite3.Connection]] = []
        self._all_lock = threading.Lock()
        with self._write() as conn:
            for statement in _SCHEMA:
                conn.execute(statement)

    @classmethod
    def in_state_dir(cls, state_dir: str | os.PathLike[str]) -> EffectLedger:
        return cls(Path(state_dir) / LEDGER_FILE)

    # --- connections --------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) == os.getpid():
            return conn
        conn = connect_wal(
            self.path, busy_timeout_ms=BUSY_TIMEOUT_MS, synchronous=self._synchronous
        )
        self._local.conn = conn
        self._local.pid = os.getpid()
        with self._all_lock:
            self._all.append((os.getpid(), conn))
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        """Close every connection this process opened (call when no thread is using it).

        Connections inherited across a fork are left alone (and kept referenced): closing
        one in the child could checkpoint or remove the parent's WAL.
        """
        pid = os.getpid()
        with self._all_lock:
            mine = [c for p, c in self._all if p == pid]
            self._all = [(p, c) for p, c in self._all if p != pid]
        for conn in mine:
            conn.close()
        self._local = threading.local()

    # --- effects ------------------------------------------------------------------------

    def apply(
        self,
        *,
        provider: str,
        tool: str,
        target: str,
        tenant: str,
        token: str,
        invocation_id: str,
        args: Mapping[str, Any],
        result: Mapping[str, Any] | EffectFn,
    ) -> dict[str, Any]:
        """Record one applied effect and return its row.

        ``result`` is either the result itself or a function that reads and updates world
        state inside the same write transaction and returns the result; if it raises,
        nothing is recorded (a definite failure leaves no effect). Not deduplicated by
        ``token``: callers that must apply at most once (callgate) are tested against that.
        """
        with self._write() as conn:
            value = dict(result(WorldTxn(conn)) if callable(result) else result)
            args_json, result_json = _canonical(dict(args)), _canonical(value)
            applied_at = self._clock_ms()
            cur = conn.execute(
                "INSERT INTO effects (provider, tool, target, tenant, token, invocation_id,"
                " args_json, result_json, applied_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    provider,
                    tool,
                    target,
                    tenant,
                    token,
                    invocation_id,
                    args_json,
                    result_json,
                    applied_at,
                ),
            )
            seq = cur.lastrowid
        row = (
            seq,
            provider,
            tool,
            target,
            tenant,
            token,
            invocation_id,
            args_json,
            result_json,
            applied_at,
        )
        return _row_to_effect(row)

    def find(self, token: str, provider: str | None = None) -> dict[str, Any] | None:
        """The first effect applied with ``token`` (optionally of one provider), or None."""
        sql = f"SELECT {_COLUMNS} FROM effects WHERE token = ?"
        params: tuple[str, ...] = (token,)
        if provider is not None:
            sql += " AND provider = ?"
            params += (provider,)
        row = self._conn().execute(sql + " ORDER BY seq LIMIT 1", params).fetchone()
        return None if row is None else _row_to_effect(row)

    def effects(
        self, *, token: str | None = None, invocation_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Every applied effect in the order applied (what ``callgate effects`` prints)."""
        sql, params = f"SELECT {_COLUMNS} FROM effects WHERE 1 = 1", list[str]()
        if token is not None:
            sql, params = sql + " AND token = ?", [*params, token]
        if invocation_id is not None:
            sql, params = sql + " AND invocation_id = ?", [*params, invocation_id]
        rows = self._conn().execute(sql + " ORDER BY seq", params).fetchall()
        return [_row_to_effect(r) for r in rows]

    def count(self, token: str | None = None) -> int:
        if token is None:
            row = self._conn().execute("SELECT COUNT(*) FROM effects").fetchone()
        else:
            row = (
                self._conn()
                .execute("SELECT COUNT(*) FROM effects WHERE token = ?", (token,))
                .fetchone()
            )
        return int(row[0])

    # --- world state --------------------------------------------------------------------

    def world_get(self, key: tuple[str, ...]) -> Any | None:
        """Read one world value outside any write (dry-runs are read-only)."""
        row = (
            self._conn()
            .execute("SELECT value_json FROM world WHERE key = ?", (_world_key(key),))
            .fetchone()
        )
        return None if row is None else json.loads(row[0])

    def world_put(self, key: tuple[str, ...], value: Any) -> None:
        """Seed or overwrite one world value (demos and tests); not an effect."""
        with self._write() as conn:
            WorldTxn(conn).put(key, value)

    def bump(self, key: tuple[str, ...]) -> int:
        """Atomically increment a counter in world state and return its new value."""
        with self._write() as conn:
            txn = WorldTxn(conn)
            value = int(txn.get(key) or 0) + 1
            txn.put(key, value)
        return value
