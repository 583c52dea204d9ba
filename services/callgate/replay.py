"""``callgate replay``: rebuild every projection from the log and compare (DESIGN "Shape").

Compliance replays the authoritative ``events`` log from the start through the same
pure projections and checks that the result equals, byte for byte, the live views.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from callgate.events import Event
from callgate.process import Process, ViewRecord

if TYPE_CHECKING:
    from callgate.render import Renderer
    from callgate.sdk import Gateway


def rebuild(
    projections: list[Process[Any]], events: Iterable[Event]
) -> tuple[int, dict[str, dict[str, str]]]:
    """Fold ``events`` (log order) through every projection; the resulting view tables."""
    states: dict[tuple[str, str], Any] = {}
    tables: dict[str, dict[str, str]] = {}
    count = 0
    for event in events:
        count += 1
        for proj in projections:
            if event.TOPIC not in proj.inputs:
                continue
            key = (proj.name, event.partition_key)
            state = states.get(key)
            if state is None:
                state = proj.initial_state()
            state, outs = proj.handle(state, event, 0)
            states[key] = state
            for out in outs:
                if isinstance(out, ViewRecord):
                    table = tables.setdefault(out.view, {})
                    if out.value_json is None:
                        table.pop(out.key, None)
                    else:
                        table[out.key] = out.value_json
    return count, tables


def replay(gate: Gateway, out: Renderer | None = None) -> dict[str, Any]:
    projections = gate.app.projections()
    started = time.perf_counter()
    events = _progress(gate.backend.read_events(), out)
    count, rebuilt = rebuild(projections, events)
    seconds = time.perf_counter() - started
    views: dict[str, Any] = {}
    names = sorted({v for p in projections for v in getattr(p, "views", ())})
    for view in names:
        live = dict(gate.backend.view_items_raw(view))
        mine = rebuilt.get(view, {})
        differing = sorted(k for k in set(live) | set(mine) if live.get(k) != mine.get(k))
        views[view] = {
            "records": len(mine),
            "live": len(live),
            "equal": not differing,
            "differing": differing[:10],
        }
    return {
        "events": count,
        "seconds": round(seconds, 3),
        "events_per_s": round(count / seconds) if seconds > 0 else None,
        "views": views,
        "equal": all(v["equal"] for v in views.values()),
    }


def _progress(events: Iterator[Event], out: Renderer | None) -> Iterator[Event]:
    if out is None or out.json_mode:
        yield from events
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn

    with Progress(
        SpinnerColumn(), TextColumn("replaying {task.completed} events"), console=out.err
    ) as bar:
        task = bar.add_task("replay", total=None)
        for n, event in enumerate(events, 1):
            if n % 1000 == 0:
                bar.update(task, completed=n)
            yield event
