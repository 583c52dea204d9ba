"""What one unit of work writes into the embedded store's open transaction.

One writer for every path of the runner (a round's processes, a timer pass, a follow-up
round, recovery), so log rows, view records and states are written the same way by each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from callgate.adapters.embedded.store import NewRow, StoreTx
from callgate.adapters.unit_of_work import Change, UnitOfWork
from callgate.domain.process_port import ViewRecord

if TYPE_CHECKING:
    from callgate.tracing import Tracing

# A unit of work's record: a log row, or a view record.
Record = NewRow | ViewRecord
Unit = UnitOfWork[str, Record]
# (topic, event type): what a unit appended to the log.
Appended = set[tuple[str, str | None]]


def write_unit(
    tx: StoreTx, unit: Unit, changes: list[Change[str]], tracing: Tracing | None
) -> Appended:
    """Append the unit's rows (each traced invocation's with its context), apply its view
    records in order, write its changed states (``changes``); returns what it appended."""
    rows = [r for r in unit.records if not isinstance(r, ViewRecord)]
    appended: Appended = set()
    if rows:
        traces = None
        if tracing is not None:  # each traced invocation's rows carry its context on
            known = ((row[3], tracing.of(row[3])) for row in rows if row[3])
            traces = {inv: tp for inv, tp in known if inv is not None and tp is not None}
        tx.insert(rows, traces)
        appended.update((row[0], row[2]) for row in rows)
    if len(rows) < len(unit.records):
        views = (r for r in unit.records if isinstance(r, ViewRecord))
        tx.put_views((v.view, v.key, v.value_json) for v in views)
    if changes:
        tx.put_states(unit.process.name, changes)
    unit.written(changes)
    return appended
