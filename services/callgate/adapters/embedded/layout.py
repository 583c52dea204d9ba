"""An embedded store written by the three-process layout, taken over by ``invocations``.

Before ADR 0077 the decider and the executor were two processes, each with its own states
and position in the store. ``invocations`` holds both states per key; started on such a
store with none of its own, it would read the log from the start with empty states and
decide every old proposal again. So, once, in one transaction: each key's state becomes
the pair of the decider's and the executor's, and the position the later of theirs.
That is exact only when neither has input left that changes its state: the composition
root first runs the two of them until idle, and a store that still has some is refused
(fail closed) with what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from callgate.adapters.embedded.runner import EmbeddedRunner
from callgate.adapters.embedded.store import EmbeddedStore, StoreTx
from callgate.domain.codes import Code, Rejection
from callgate.domain.process_port import Process
from callgate.executor.invocations import EARLIER_LAYOUT, Invocations, InvocationsState

PAGE = 1_000


def earlier_layout_in(store: EmbeddedStore, name: str) -> bool:
    """Whether the store was run by the earlier layout and not yet by process ``name``."""
    return not store.position(name) and any(store.position(p) for p in EARLIER_LAYOUT)


def take_over_earlier_layout(
    store: EmbeddedStore,
    invocations: Invocations,
    runner_of: Callable[[Sequence[Process[Any]]], EmbeddedRunner],
) -> int:
    """When the earlier layout ran ``store``: its decider and executor finish what they
    have left (``runner_of`` builds their runner; it runs under the store's lock), then
    their states move (``adopt_earlier_layout``); returns how many keys moved. Raises
    ``Rejection(busy)`` while another process holds the store."""
    if not earlier_layout_in(store, invocations.name):
        return 0
    earlier = runner_of([invocations.decider, invocations.executor])
    if not earlier.try_acquire():
        raise Rejection(
            Code.BUSY,
            "another callgate process holds this state directory; stop it before "
            "this version takes it over (docs/how-to/upgrades.md)",
        )
    try:
        earlier.run_until_idle()
    finally:
        earlier.release()
    return adopt_earlier_layout(store, invocations)


def adopt_earlier_layout(store: EmbeddedStore, invocations: Invocations) -> int:
    """Move the earlier layout's states to ``invocations``; returns how many keys moved
    (0 when there is nothing to adopt). Raises ``Rejection(usage)`` when the earlier
    processes have input left that they have not handled."""
    name = invocations.name
    with store.transaction() as tx:
        positions = {process: tx.position(process) for process in EARLIER_LAYOUT}
        if tx.position(name) or not any(positions.values()):
            return 0
        decider, executor = invocations.decider, invocations.executor
        for part in (decider, executor):
            left = _unhandled(tx, positions[part.name], part.inputs, part.reacts_to)
            if left:
                raise Rejection(
                    Code.USAGE,
                    f"this state directory's {part.name} has {left} event(s) left to handle; "
                    "run the earlier callgate version until its calls settle, then start "
                    "this one (docs/how-to/upgrades.md)",
                )
        moved = 0
        after = ""
        while page := tx.states_after(decider.name, after, PAGE):
            executed = tx.load_states(executor.name, [key for key, _ in page])
            rows = []
            for key, blob in page:
                found = executed.get(key)
                state = InvocationsState(
                    decider.load_state(blob),
                    executor.initial_state() if found is None else executor.load_state(found),
                )
                rows.append((key, invocations.dump_state(state), invocations.next_due(state)))
            tx.put_states(name, rows)
            moved += len(rows)
            after = page[-1][0]
        tx.set_position(name, max(positions.values()))
        return moved


def _unhandled(tx: StoreTx, position: int, topics: frozenset[str], wanted: frozenset[type]) -> int:
    """Rows after ``position`` of ``topics`` whose type the process reacts to."""
    names = {cls.__name__ for cls in wanted}
    count, after = 0, position
    while rows := tx.fetch(topics, after, PAGE):
        count += sum(1 for row in rows if row.event_type in names)
        after = rows[-1].seq
    return count
