"""Deciding the recorded history again on every core (``callgate policy simulate``).

The recorded decisions are read and decoded here, then split into contiguous slices; the
slices are decided in forked children (the candidate's policy engine is built before the
fork, so each child starts with it) while this process decides the first. Children send
back only their changes, which are few; the recorded outcomes of changes are looked up
here, on the one backend connection, never from a child.

A candidate with usage limits is decided in one process, in order: what a call finds
used depends on every call before it (``callgate.domain.simulated_usage``).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
from collections.abc import Callable, Sequence

from callgate.domain.events import Event, PolicyDecided
from callgate.domain.simulated_usage import replay
from callgate.domain.simulation import Change, SimulationReport, Simulator

# Below this many decisions one process is quicker than starting others.
PARALLEL_FROM = 20_000


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def simulate(
    simulator: Simulator,
    history: Sequence[Event],
    outcome_of: Callable[[str], str | None],
    *,
    tenant: str | None = None,
    since_ms: int | None = None,
    workers: int | None = None,
) -> SimulationReport:
    """``simulator``'s report on ``history`` (its ``PolicyDecided``; with limits, the
    ``HISTORY_EVENTS`` in order), decided over ``workers`` processes (default: one per
    usable core, one for a short history)."""
    if simulator.profile.limits:
        decided_n, found, refusals = replay(simulator, history, tenant=tenant, since_ms=since_ms)
        return simulator.report(decided_n, found, outcome_of, refusals)
    decisions = [e for e in history if isinstance(e, PolicyDecided)]
    n = workers or (usable_cores() if len(decisions) >= PARALLEL_FROM else 1)
    size = -(-len(decisions) // max(1, n))
    slices = [decisions[at : at + size] for at in range(0, len(decisions), size)] or [[]]
    context = multiprocessing.get_context("fork")
    children = []
    for part in slices[1:]:
        reader, writer = context.Pipe(duplex=False)
        child = context.Process(
            target=_decide_slice, args=(simulator, part, tenant, since_ms, writer), daemon=True
        )
        child.start()
        writer.close()
        children.append((child, reader))
    decided, found = simulator.differing(slices[0], tenant=tenant, since_ms=since_ms)
    changes: list[Change] = list(found)
    for child, reader in children:
        part_decided, part_found = pickle.loads(reader.recv_bytes())
        child.join()
        decided += part_decided
        changes.extend(part_found)
    return simulator.report(decided, changes, outcome_of)


def _decide_slice(
    simulator: Simulator,
    part: Sequence[PolicyDecided],
    tenant: str | None,
    since_ms: int | None,
    writer: multiprocessing.connection.Connection,
) -> None:
    result = simulator.differing(part, tenant=tenant, since_ms=since_ms)
    writer.send_bytes(pickle.dumps(result))
    writer.close()
