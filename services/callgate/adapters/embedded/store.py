"""The embedded backend's durable event store: one SQLite file under the state directory.

The log plays the role of the Kafka topics (``requests``, ``events``, ``dead-letter``), one
totally ordered sequence (``seq``) instead of partitions. Events are stored as the same Avro
bytes the Kafka backend produces. Next to the log, in the same database and therefore in the
same transactions, live what the runner commits with its input position: per-key process
state, keyed views and the positions themselves (ADR 0006); the tables: ``schema``.

Durability: WAL journal with ``synchronous=FULL``, so a commit that returned survives a
process kill *and* a power loss. Writers take the write lock up front (``BEGIN IMMEDIATE``)
so that a read-then-write transaction never fails half way with SQLITE_BUSY; a second
writer (a CLI appending a request while ``callgate serve`` runs) waits ``busy_timeout``.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from callgate.adapters.embedded.schema import SCHEMA
from callgate.domain.events import Event
from callgate.sqlite import connect_wal

DB_FILE = "events.sqlite3"
_BUSY_TIMEOUT_MS = 30_000
# Bound on host parameters per statement (SQLite's default limit is 32766).
_CHUNK = 900
# WAL pages (4 KiB) before a commit checkpoints them into the database file. SQLite's 1,000
# made nearly every busy round's commit a checkpoint too (a second fsync, and a rewrite of
# state and view pages that the next round changes again); 10,000 (about 40 MiB of WAL)
# took the runner's commit time from 0.78 to 0.57 s over a 10,000-proposal burst.
_WAL_CHECKPOINT_PAGES = 10_000


class EventCodec(Protocol):
    """What the store and runner need from the event codec (``AvroCodec``)."""

    def encode(self, event: Event) -> bytes: ...

    def decode(self, data: bytes) -> Event: ...

    def event_type_of(self, data: bytes) -> str | None: ...

    def event_class_of(self, data: bytes) -> type[Event] | None: ...


@dataclass(frozen=True, slots=True)
class LogRow:
    """One stored event: ``seq`` is its position in the (single, totally ordered) log."""

    seq: int
    topic: str
    partition_key: str
    event_type: str | None
    invocation_id: str | None
    payload: bytes


# (topic, partition_key, event_type, invocation_id, payload): a row before it has a seq.
NewRow = tuple[str, str, str | None, str | None, bytes]
_ROW_COLUMNS = "seq, topic, partition_key, event_type, invocation_id, payload"
# (seq, topic, partition_key, invocation_id, payload, traceparent): an input row as the
# runner reads it; ``traceparent`` is the invocation's W3C trace context (ADR 0036).
InputRow = tuple[int, str, str, str | None, bytes, str | None]


def event_row(event: Event, payload: bytes) -> NewRow:
    """The log row of an encoded event; the topic is the event class's ``TOPIC``."""
    return (type(event).TOPIC, event.partition_key, event.event_type, event.invocation_id, payload)


class StoreTx:
    """Operations inside one write transaction (see ``EmbeddedStore.transaction``)."""

    __slots__ = ("_cur",)

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cur = cursor

    def position(self, process: str) -> int:
        row = self._cur.execute("SELECT seq FROM positions WHERE process=?", (process,)).fetchone()
        return int(row[0]) if row else 0

    def set_position(self, process: str, seq: int) -> None:
        self._cur.execute(
            "INSERT INTO positions(process, seq) VALUES (?, ?) "
            "ON CONFLICT(process) DO UPDATE SET seq=excluded.seq",
            (process, seq),
        )

    def fetch(self, topics: Iterable[str], after_seq: int, limit: int) -> list[LogRow]:
        names = sorted(topics)
        marks = ",".join("?" * len(names))
        rows = self._cur.execute(
            f"SELECT {_ROW_COLUMNS} FROM log WHERE topic IN ({marks}) AND seq > ? "
            "ORDER BY seq LIMIT ?",
            (*names, after_seq, limit),
        ).fetchall()
        return [LogRow(*r) for r in rows]

    def fetch_inputs(self, topics: Iterable[str], after_seq: int, limit: int) -> list[InputRow]:
        """``fetch`` as plain tuples: the runner's per-batch read, where building a
        ``LogRow`` per row cost two thirds as much as the query (ADR 0006, "Throughput")."""
        names = sorted(topics)
        marks = ",".join("?" * len(names))
        rows: list[InputRow] = self._cur.execute(
            f"SELECT seq, topic, partition_key, invocation_id, payload, traceparent FROM log "
            f"WHERE topic IN ({marks}) AND seq > ? ORDER BY seq LIMIT ?",
            (*names, after_seq, limit),
        ).fetchall()
        return rows

    def insert(self, rows: Sequence[NewRow], traces: Mapping[str, str] | None = None) -> None:
        """Append ``rows``; with ``traces`` (invocation id -> ``traceparent``), each row of
        a traced invocation carries its context on (ADR 0036)."""
        if not traces:
            self._cur.executemany(
                "INSERT INTO log(topic, partition_key, event_type, invocation_id, payload) "
                "VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            return
        self._cur.executemany(
            "INSERT INTO log(topic, partition_key, event_type, invocation_id, payload, "
            "traceparent) VALUES (?, ?, ?, ?, ?, ?)",
            [(*row, traces.get(row[3] or "")) for row in rows],
        )

    def traceparent_of(self, invocation_id: str) -> str | None:
        """The trace context an earlier row of the invocation carried (ADR 0036)."""
        row = self._cur.execute(
            "SELECT traceparent FROM log WHERE invocation_id=? AND traceparent IS NOT NULL "
            "ORDER BY seq LIMIT 1",
            (invocation_id,),
        ).fetchone()
        return None if row is None else str(row[0])

    def claim_dead_letter(self, topic: str, seq: int) -> bool:
        """True the first time a poison row is claimed: only that claimant dead-letters it."""
        self._cur.execute(
            "INSERT OR IGNORE INTO dead_lettered(topic, seq) VALUES (?, ?)", (topic, seq)
        )
        return self._cur.rowcount == 1

    def load_states(self, process: str, keys: Sequence[str]) -> dict[str, bytes]:
        found: dict[str, bytes] = {}
        for i in range(0, len(keys), _CHUNK):
            chunk = keys[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            for key, blob in self._cur.execute(
                f"SELECT key, blob FROM state WHERE process=? AND key IN ({marks})",
                (process, *chunk),
            ):
                found[key] = blob
        return found

    def put_states(self, process: str, states: Sequence[tuple[str, bytes, int | None]]) -> None:
        """Upsert ``(key, blob, next_due)`` rows of one process."""
        self._cur.executemany(
            "INSERT INTO state(process, key, blob, next_due) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(process, key) DO UPDATE SET blob=excluded.blob, "
            "next_due=excluded.next_due",
            [(process, k, b, d) for k, b, d in states],
        )

    def due_states(self, process: str, now_ms: int, limit: int) -> list[tuple[str, bytes]]:
        rows = self._cur.execute(
            "SELECT key, blob FROM state WHERE process=? AND next_due <= ? "
            "ORDER BY next_due, key LIMIT ?",
            (process, now_ms, limit),
        ).fetchall()
        return [(k, b) for k, b in rows]

    def states_after(self, process: str, after_key: str, limit: int) -> list[tuple[str, bytes]]:
        """Stored states of ``process`` in key order, for paging through all of them."""
        rows = self._cur.execute(
            "SELECT key, blob FROM state WHERE process=? AND key > ? ORDER BY key LIMIT ?",
            (process, after_key, limit),
        ).fetchall()
        return [(k, b) for k, b in rows]

    def meta(self, name: str) -> str | None:
        row = self._cur.execute("SELECT value FROM runner_meta WHERE name=?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, name: str, value: str) -> None:
        self._cur.execute(
            "INSERT INTO runner_meta(name, value) VALUES(?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value=excluded.value",
            (name, value),
        )

    def prune_requests(self, consumed_through: int, retention_ms: int) -> int:
        """Delete ``requests`` rows up to ``consumed_through`` (every consumer's position)
        appended at least ``retention_ms`` ago; returns how many. Replay needs only
        ``events``, and the decider recorded each request's verified principal there."""
        cutoff = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) - ?"  # SQLite's clock
        old = f"SELECT seq FROM request_times WHERE seq <= ? AND appended_at <= {cutoff}"
        self._cur.execute(
            f"DELETE FROM log WHERE topic = 'requests' AND seq IN ({old})",
            (consumed_through, retention_ms),
        )
        pruned = self._cur.rowcount
        self._cur.execute(
            f"DELETE FROM request_times WHERE seq IN ({old})", (consumed_through, retention_ms)
        )
        return pruned

    def put_views(self, records: Iterable[tuple[str, str, str | None]]) -> None:
        """Apply ``(view, key, value_json)`` records in order; ``None`` is a tombstone."""
        last: dict[tuple[str, str], str | None] = {}
        for view, key, value in records:
            last[(view, key)] = value  # only the last record of a key survives the batch
        self._cur.executemany(
            "DELETE FROM views WHERE view=? AND key=?",
            [vk for vk, value in last.items() if value is None],
        )
        self._cur.executemany(
            "INSERT INTO views(view, key, value_json) VALUES (?, ?, ?) "
            "ON CONFLICT(view, key) DO UPDATE SET value_json=excluded.value_json",
            [(*vk, value) for vk, value in last.items() if value is not None],
        )


class EmbeddedStore:
    """The durable local event store under ``state_dir`` (file ``events.sqlite3``).

    Safe to share between threads (one SQLite connection per thread) and between processes
    (SQLite locking; WAL lets readers run while one writer commits).
    """

    def __init__(
        self,
        state_dir: str | Path,
        codec: EventCodec | None = None,
        *,
        synchronous: str = "FULL",
    ) -> None:
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"unsupported synchronous mode {synchronous!r}")
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.state_dir / DB_FILE
        self._synchronous = synchronous
        self._codec = codec
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        conn = self._conn()
        for stmt in SCHEMA:
            conn.execute(stmt)
        columns = {r[1] for r in conn.execute("PRAGMA table_info(log)")}
        if "traceparent" not in columns:  # a store from before traces (ADR 0036)
            conn.execute("ALTER TABLE log ADD COLUMN traceparent TEXT")

    @property
    def codec(self) -> EventCodec:
        if self._codec is None:
            from callgate.adapters.avro_codec import AvroCodec

            self._codec = AvroCodec.default()
        return self._codec

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect_wal(
                self.path, busy_timeout_ms=_BUSY_TIMEOUT_MS, synchronous=self._synchronous
            )
            conn.execute(f"PRAGMA wal_autocheckpoint = {_WAL_CHECKPOINT_PAGES}")
            self._local.conn = conn
            with self._guard:
                self._connections.append(conn)
        return conn

    @contextmanager
    def transaction(self) -> Iterator[StoreTx]:
        """One write transaction: commits on normal exit, rolls back on any exception."""
        conn = self._conn()
        cur = conn.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield StoreTx(cur)
            cur.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
        finally:
            cur.close()

    # --- clients -------------------------------------------------------------------------

    def append(self, events: Sequence[Event], traceparent: str | None = None) -> None:
        """Publish events (CLI/SDK requests), atomically, each to its class's ``TOPIC``;
        ``traceparent``: the trace context they carry (the proposal's span)."""
        codec = self.codec
        rows = [event_row(ev, codec.encode(ev)) for ev in events]
        traces = None if traceparent is None else {ev.invocation_id: traceparent for ev in events}
        with self.transaction() as tx:
            tx.insert(rows, traces)

    def probe_write(self) -> None:
        """One small write transaction; raises as a bigger one would while the disk refuses
        writes (the runner's cheap test before it tries a refused round again, ADR 0084)."""
        with self.transaction() as tx:
            tx.set_meta("probed_at_ns", str(time.time_ns()))

    def append_raw(self, topic: str, partition_key: str, payload: bytes) -> None:
        """Append bytes as they came (tests use it to publish poison input)."""
        event_type = self.codec.event_type_of(payload)
        with self.transaction() as tx:
            tx.insert([(topic, partition_key, event_type, None, payload)])

    def prune_requests(self, readers: Sequence[str], retention_ms: int) -> int:
        """Delete the ``requests`` rows every one of ``readers`` consumed that were appended
        ``retention_ms`` ago or earlier (ADR 0016); returns how many.

        They hold bearer tokens, so the delete overwrites their bytes (``secure_delete``)
        and, when it deleted any, a checkpoint truncates the WAL, which still holds the
        pages as they were (best effort: it does not wait for readers to finish).
        """
        conn = self._conn()
        (previous,) = conn.execute("PRAGMA secure_delete").fetchone()
        conn.execute("PRAGMA secure_delete=ON")
        try:
            with self.transaction() as tx:
                through = min(tx.position(name) for name in readers) if readers else 0
                pruned = tx.prune_requests(through, retention_ms)
        finally:
            conn.execute(f"PRAGMA secure_delete={int(previous)}")
        if pruned:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return pruned

    # --- readers -------------------------------------------------------------------------

    def read_log(
        self,
        topic: str | None = None,
        after_seq: int = 0,
        limit: int = 10_000,
        event_type: str | tuple[str, ...] | None = None,
    ) -> list[LogRow]:
        """Rows after ``after_seq`` in log order (of ``topic``, of ``event_type`` as filed:
        one name or several)."""
        where = "seq > ?"
        args: list[object] = [after_seq, limit]
        if topic is not None:
            where, args = "topic = ? AND seq > ?", [topic, after_seq, limit]
        if event_type is not None:
            kinds = (event_type,) if isinstance(event_type, str) else event_type
            marks = ", ".join("?" * len(kinds))
            where, args = f"{where} AND event_type IN ({marks})", [*args[:-1], *kinds, limit]
        rows = self._conn().execute(
            f"SELECT {_ROW_COLUMNS} FROM log WHERE {where} ORDER BY seq LIMIT ?", args
        )
        return [LogRow(*r) for r in rows]

    def read_shard(
        self,
        topic: str,
        shard: tuple[int, int] = (0, 1),
        after_seq: int = 0,
        through_seq: int | None = None,
        limit: int = 10_000,
    ) -> list[tuple[int, str, bytes]]:
        """``(seq, partition_key, payload)`` of ``topic``'s rows after ``after_seq`` (up to
        ``through_seq``), in log order, without building ``LogRow`` s: the bulk read of
        ``callgate replay``.

        ``shard=(i, n)`` keeps the rows whose partition key is in shard ``i`` of ``n`` (by its
        last character), so that n readers split the log and each key's rows stay together.
        """
        index, shards = shard
        if not 0 <= index < shards:
            raise ValueError(f"no shard {index} of {shards}")
        last = self.last_seq() if through_seq is None else through_seq
        found: list[tuple[int, str, bytes]] = (
            self._conn()
            .execute(
                "SELECT seq, partition_key, payload FROM log WHERE topic = ? AND seq > ? "
                "AND seq <= ? AND COALESCE(unicode(substr(partition_key, -1)), 0) % ? = ? "
                "ORDER BY seq LIMIT ?",
                (topic, after_seq, last, shards, index, limit),
            )
            .fetchall()
        )
        return found

    def read_invocation(self, invocation_id: str) -> list[LogRow]:
        """Every logged event of one invocation, in log order (status lookups)."""
        rows = self._conn().execute(
            f"SELECT {_ROW_COLUMNS} FROM log WHERE invocation_id=? ORDER BY seq",
            (invocation_id,),
        )
        return [LogRow(*r) for r in rows]

    def last_seq(self) -> int:
        row = self._conn().execute("SELECT MAX(seq) FROM log").fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def position(self, process: str) -> int:
        row = self._conn().execute("SELECT seq FROM positions WHERE process=?", (process,))
        found = row.fetchone()
        return int(found[0]) if found else 0

    def has_input(self, process: str, topics: Iterable[str]) -> bool:
        """Whether rows of ``topics`` follow ``process``'s position: a lock-free idle check."""
        names = sorted(topics)
        marks = ",".join("?" * len(names))
        row = self._conn().execute(
            f"SELECT 1 FROM log WHERE topic IN ({marks}) AND seq > "
            "COALESCE((SELECT seq FROM positions WHERE process=?), 0) LIMIT 1",
            (*names, process),
        )
        return row.fetchone() is not None

    def backlog(self, process: str, topics: Iterable[str]) -> int:
        """How many rows of ``topics`` follow ``process``'s position (consumer lag)."""
        names = sorted(topics)
        marks = ",".join("?" * len(names))
        row = self._conn().execute(
            f"SELECT COUNT(*) FROM log WHERE topic IN ({marks}) AND seq > "
            "COALESCE((SELECT seq FROM positions WHERE process=?), 0)",
            (*names, process),
        )
        return int(row.fetchone()[0])

    def view_tally(self, view: str, fields: Sequence[str]) -> dict[tuple[str, ...], int]:
        """How many values of ``view`` have each combination of the top-level ``fields``
        (one aggregate query; /metrics)."""
        columns = ", ".join(f"COALESCE(json_extract(value_json, '$.{f}'), '')" for f in fields)
        rows = self._conn().execute(
            f"SELECT {columns}, COUNT(*) FROM views WHERE view=? GROUP BY {columns}", (view,)
        )
        return {tuple(str(c) for c in row[:-1]): int(row[-1]) for row in rows}

    def count(self, topic: str) -> int:
        """How many rows ``topic`` holds (e.g. dead letters)."""
        row = self._conn().execute("SELECT COUNT(*) FROM log WHERE topic=?", (topic,))
        return int(row.fetchone()[0])

    def count_type(self, event_type: str) -> int:
        """How many rows of ``event_type`` the log holds (its ``event_type`` column)."""
        row = self._conn().execute("SELECT COUNT(*) FROM log WHERE event_type=?", (event_type,))
        return int(row.fetchone()[0])

    def has_due(self, process: str, now_ms: int) -> bool:
        """Whether a timer of ``process`` is due at ``now_ms``: a lock-free idle check."""
        row = self._conn().execute(
            "SELECT 1 FROM state WHERE process=? AND next_due <= ? LIMIT 1", (process, now_ms)
        )
        return row.fetchone() is not None

    def view(self, view: str, key: str) -> str | None:
        row = (
            self._conn()
            .execute("SELECT value_json FROM views WHERE view=? AND key=?", (view, key))
            .fetchone()
        )
        return str(row[0]) if row else None

    def view_items(self, view: str) -> list[tuple[str, str]]:
        rows = self._conn().execute(
            "SELECT key, value_json FROM views WHERE view=? ORDER BY key", (view,)
        )
        return [(str(k), str(v)) for k, v in rows]

    def close(self) -> None:
        with self._guard:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()
