"""Processes that open one fresh SQLite file at once all get it (two ``serve`` on one state dir).

``PRAGMA journal_mode = WAL`` answers "database is locked" at once, busy timeout or not,
to the loser of a concurrent conversion; with two processes that happened in about two
rounds of three here before opening retried it.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from pathlib import Path

import pytest

from callgate.adapters.embedded.store import EmbeddedStore
from callgate.providers.ledger import EffectLedger

ROUNDS = 60


def _open_ledger(directory: str) -> None:
    EffectLedger.in_state_dir(directory).close()


def _open_store(directory: str) -> None:
    EmbeddedStore(directory).close()


@pytest.mark.parametrize("opener", [_open_ledger, _open_store], ids=["effect-ledger", "store"])
def test_two_processes_opening_one_fresh_file_both_succeed(
    tmp_path: Path, opener: Callable[[str], None]
) -> None:
    ctx = multiprocessing.get_context("fork")
    failed = []
    for n in range(ROUNDS):
        directory = tmp_path / str(n)
        procs = [ctx.Process(target=opener, args=(str(directory),)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        failed += [n for p in procs if p.exitcode != 0]
    assert failed == [], f"an opener failed in rounds {failed}"
