"""The Kafka worker's per-process settings name real processes, none on a caller's path."""

from __future__ import annotations

from pathlib import Path

from callgate.adapters.kafka.worker import BATCH_LINGER_MS, SETTLED_REPORTER
from callgate.bootstrap import Settings, bootstrap


def test_lingering_processes_exist_and_none_is_on_a_callers_path(tmp_path: Path) -> None:
    """A renamed process would silently lose its linger; the status view (what ``propose``
    and the bench wait for) and the invocations process must never linger."""
    names = {p.name for p in bootstrap(Settings(state_dir=tmp_path, dev=True)).processes()}
    assert set(BATCH_LINGER_MS) <= names, set(BATCH_LINGER_MS) - names
    on_path = {"invocations", SETTLED_REPORTER, "pending-projection"}
    assert not on_path & set(BATCH_LINGER_MS)
    assert all(0 < ms <= 250 for ms in BATCH_LINGER_MS.values()), BATCH_LINGER_MS
