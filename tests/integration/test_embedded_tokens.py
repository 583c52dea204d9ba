"""No bearer credentials kept on the embedded store either (ADR 0016).

After a run through the SDK (reads, an approval, a refused approver), every table of the
SQLite store is scanned for the session tokens used: they appear only in ``requests`` rows
of the log, and the ``events`` rows carry the token digests instead. With
``requests_retention_ms=0`` the consumed requests are pruned, no token is left at all
(not even in the raw bytes of the database and its WAL), and ``callgate replay`` still
rebuilds equal views (it needs only ``events``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from callgate.adapters.embedded.store import DB_FILE
from callgate.application.replay import replay
from callgate.bootstrap import Settings
from callgate.domain.codes import Rejection
from callgate.domain.identity import token_digest
from callgate.surfaces.sdk import Gateway, connect

REFUND = {"order_id": "ORD-42", "amount_cents": 5000, "currency": "EUR"}


def scenario(gate: Gateway, key: str) -> dict[str, str]:
    """Calls that put tokens in requests: proposals, an approval, a refused approver."""
    issue = gate.app.session_issuer.issue
    now = gate.app.clock()
    tokens = {
        "alice": issue("alice", "acme", ["support"], now),
        "carol": issue("carol", "acme", ["finance-approver"], now),
    }
    alice = tokens["alice"]
    assert gate.propose(alice, "tickets.read", {"ticket_id": "T-1"})["outcome"] == "executed"
    first = gate.propose(alice, "refunds.issue", REFUND, idempotency_key=key)
    assert first["outcome"] == "approval_required", first
    with pytest.raises(Rejection):
        gate.approve(first["invocation_id"], tokens["carol"])  # owner confirmation only
    approval = gate.approve(first["invocation_id"], alice)
    assert approval["outcome"] == "executed", approval  # the approved call continued
    again = gate.propose(alice, "refunds.issue", REFUND, key, approval["approval_id"])
    assert again["outcome"] == "replayed", again  # a resubmission replays it: one effect
    return tokens


def where_found(state_dir: Path, tokens: dict[str, str]) -> set[str]:
    """``table`` (or ``log:<topic>``) of every stored cell holding one of ``tokens``."""
    found: set[str] = set()
    with sqlite3.connect(state_dir / DB_FILE) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            columns = [r[1] for r in db.execute(f"PRAGMA table_info({table})")]
            for row in db.execute(f"SELECT * FROM {table}"):
                cells = dict(zip(columns, row, strict=True))
                for cell in cells.values():
                    blob = cell.encode() if isinstance(cell, str) else cell
                    if isinstance(blob, bytes) and any(t.encode() in blob for t in tokens.values()):
                        found.add(f"log:{cells['topic']}" if table == "log" else table)
    return found


def files_holding(state_dir: Path, tokens: dict[str, str]) -> set[str]:
    """The store's files (the database, its WAL) whose raw bytes hold one of ``tokens``."""
    return {
        path.name
        for path in state_dir.rglob("*")
        if path.is_file() and any(t.encode() in path.read_bytes() for t in tokens.values())
    }


def digests_logged(state_dir: Path, tokens: dict[str, str]) -> set[str]:
    found = set()
    with sqlite3.connect(state_dir / DB_FILE) as db:
        for (payload,) in db.execute("SELECT payload FROM log WHERE topic = 'events'"):
            for who, tok in tokens.items():
                if (token_digest(tok) or "").encode() in payload:
                    found.add(who)
    return found


def test_tokens_stay_only_on_requests_and_events_hold_digests(tmp_path: Path) -> None:
    gate = connect(Settings(state_dir=tmp_path, dev=True))
    try:
        tokens = scenario(gate, "K-emb-1")
    finally:
        gate.close()
    assert where_found(tmp_path, tokens) == {"log:requests"}
    assert files_holding(tmp_path, tokens) <= {DB_FILE, f"{DB_FILE}-wal"}
    assert digests_logged(tmp_path, tokens) == {"alice", "carol"}


def test_with_zero_retention_no_token_is_left_and_replay_is_equal(tmp_path: Path) -> None:
    gate = connect(Settings(state_dir=tmp_path, requests_retention_ms=0, dev=True))
    try:
        tokens = scenario(gate, "K-emb-0")
        gate.backend.wait(lambda: False, 0.3)  # a last round: prune what it consumed
        assert where_found(tmp_path, tokens) == set()
        assert files_holding(tmp_path, tokens) == set()  # deleted bytes overwritten too
        report = replay(gate)
        assert report["equal"] is True, report
    finally:
        gate.close()
    assert digests_logged(tmp_path, tokens) == {"alice", "carol"}
