"""``callgate replay``: rebuild every projection from the log and compare (docs/contract.md
"Shape"). The operator's use case: it reads the log through the client's backend
(``read_events``, ``view_items_raw``) or, embedded, the store's ``read_shard``, folds it
through the pure projections and writes nothing; the surface that asks shows progress.

Compliance replays the authoritative ``events`` log from the start through the same
pure projections and checks that the result equals, byte for byte, the live views.

Speed: each projection is called only for the event classes it reacts to
(``Projection.reacts_to``), and on the embedded backend the log is split by partition key
into shards folded in parallel processes. Projection state is per partition key, so a
shard folds each of its keys exactly as the whole log would. Were a view key written from
two shards (only a hostile log does that, e.g. one invocation id in two partitions), which
write is the last would depend on the order across shards: the log is then folded again in
one process, in log order, as the live views were.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from callgate.domain.events import Event
from callgate.domain.process_port import Process, ViewRecord, reacts_to

if TYPE_CHECKING:
    from callgate.adapters.embedded.store import EmbeddedStore, EventCodec
    from callgate.application.client import Gateway

# A view while rebuilding: key -> its last value (None: a tombstone).
Table = dict[str, str | None]
Step = Callable[[Any, Event], tuple[Any, Sequence[object]]]
# What a surface wraps the events of a rebuild in to show them go by, given the number of
# shards (only the events of the first are seen here): the same events, in the same order.
Progress = Callable[[Iterator[Event], int], Iterator[Event]]

EVENTS = "events"
# Below this many log rows one process is quicker than starting others.
PARALLEL_FROM = 20_000
# Shards go by a key's last character (a hex digit in practice): more would idle.
MAX_WORKERS = 8
_PAGE = 20_000


class Rebuilt(NamedTuple):
    """What a rebuild found: events folded, view tables, processes that folded them."""

    events: int
    views: dict[str, dict[str, str]]
    processes: int


def rebuild(
    projections: list[Process[Any]], events: Iterable[Event]
) -> tuple[int, dict[str, dict[str, str]]]:
    """Fold ``events`` (log order) through every projection; the resulting view tables."""
    count, tables = fold(projections, events)
    return count, merge([tables])


def fold(
    projections: Sequence[Process[Any]], events: Iterable[Event]
) -> tuple[int, dict[str, Table]]:
    """Fold ``events`` (in log order) through every projection; the last value per view key.

    A projection is called for an event when the event's topic is one of its inputs and,
    for a ``Projection``, its class is in ``reacts_to``: for any other class ``project``
    returns the same state and no records, so skipping the call changes nothing.
    """
    states: list[dict[str, Any]] = [{} for _ in projections]
    routes: dict[type[Event], list[tuple[Step, dict[str, Any], Callable[[], Any]]]] = {}
    tables: dict[str, Table] = {}
    count = 0
    for event in events:
        count += 1
        cls = type(event)
        route = routes.get(cls)
        if route is None:
            route = routes[cls] = _route(projections, states, cls)
        key = event.partition_key
        for step, table_of, initial in route:
            state = table_of.get(key)
            if state is None:
                state = initial()
            table_of[key], outs = step(state, event)
            for out in outs:
                if isinstance(out, ViewRecord):
                    view = tables.get(out.view)
                    if view is None:
                        view = tables[out.view] = {}
                    view[out.key] = out.value_json
    return count, tables


def _route(
    projections: Sequence[Process[Any]], states: list[dict[str, Any]], cls: type[Event]
) -> list[tuple[Step, dict[str, Any], Callable[[], Any]]]:
    from callgate_projections import Projection

    route: list[tuple[Step, dict[str, Any], Callable[[], Any]]] = []
    for proj, table_of in zip(projections, states, strict=True):
        wanted = reacts_to(proj)
        if cls.TOPIC not in proj.inputs or (wanted is not None and cls not in wanted):
            continue
        if isinstance(proj, Projection):
            step: Step = proj.project
        else:
            step = _handle(proj)
        route.append((step, table_of, proj.initial_state))
    return route


def _handle(proj: Process[Any]) -> Step:
    def step(state: Any, event: Event) -> tuple[Any, Sequence[object]]:
        return proj.handle(state, event, 0)

    return step


class _Unshardable(Exception):
    """The shards of a log do not fold independently (see the module docstring)."""


def merge(parts: Iterable[dict[str, Table]]) -> dict[str, dict[str, str]]:
    """The views of folds over disjoint shards, tombstones dropped.

    Raises ``_Unshardable`` when two parts wrote one view key.
    """
    merged: dict[str, Table] = {}
    for tables in parts:
        for view, table in tables.items():
            into = merged.setdefault(view, {})
            if into and not into.keys().isdisjoint(table):
                raise _Unshardable(view)
            into.update(table)
    return {view: _live(table) for view, table in merged.items()}


def _live(table: Table) -> dict[str, str]:
    if None not in table.values():
        return cast(dict[str, str], table)  # no tombstone: no copy
    return {key: value for key, value in table.items() if value is not None}


def replay(
    gate: Gateway, progress: Progress | None = None, workers: int | None = None
) -> dict[str, Any]:
    """Rebuild every projection from the log, time it, and compare with the live views.

    ``workers``: processes folding shards of an embedded log (default: one per usable core
    up to ``MAX_WORKERS``, one when the log is small); other backends read ``read_events``
    in one process. The timed region is the whole rebuild, the comparison follows it.
    """
    projections = gate.app.projections()
    started = time.perf_counter()
    count, rebuilt, processes = _rebuild_backend(gate, projections, progress, workers)
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
        "processes": processes,
        "views": views,
        "equal": all(v["equal"] for v in views.values()),
    }


def _rebuild_backend(
    gate: Gateway, projections: list[Process[Any]], progress: Progress | None, workers: int | None
) -> Rebuilt:
    from callgate.adapters.embedded.store import EmbeddedStore

    store = getattr(gate.backend, "store", None)
    codec = getattr(gate.backend, "codec", None)
    if isinstance(store, EmbeddedStore) and codec is not None:
        shards = workers or _cores()
        if workers is None and store.last_seq() < PARALLEL_FROM:
            shards = 1
        return rebuild_sharded(store, codec, projections, max(1, shards), progress)
    return Rebuilt(*rebuild(projections, _progress(gate.backend.read_events(), progress)), 1)


def _cores() -> int:
    """Cores this process may run on, at most ``MAX_WORKERS``."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count() or 1
    return max(1, min(usable, MAX_WORKERS))


def rebuild_sharded(
    store: EmbeddedStore,
    codec: EventCodec,
    projections: list[Process[Any]],
    shards: int,
    progress: Progress | None = None,
) -> Rebuilt:
    """``rebuild`` of an embedded log, split by partition key over ``shards`` processes.

    This process folds shard 0 while forked children fold the others and send back their
    tables. The log rows are sharded by their partition key column; should a row's column
    disagree with its event (only ``append_raw`` can file it so), or two shards write one
    view key, the whole log is folded here instead, in log order.
    """
    through = store.last_seq()  # every shard folds the same prefix of a growing log
    if shards > 1:
        try:
            return _rebuild_parallel(store, codec, projections, shards, through, progress)
        except _Unshardable:
            pass
    mine = _progress(_shard_events(store, codec, (0, 1), through), progress)
    count, tables = fold(projections, mine)
    return Rebuilt(count, merge([tables]), 1)


def _rebuild_parallel(
    store: EmbeddedStore,
    codec: EventCodec,
    projections: list[Process[Any]],
    shards: int,
    through: int,
    progress: Progress | None,
) -> Rebuilt:
    context = multiprocessing.get_context("fork")
    children: list[tuple[Any, Connection]] = []
    try:
        for index in range(1, shards):
            receive, send = context.Pipe(duplex=False)
            child = context.Process(
                target=_fold_child,
                args=(send, store.state_dir, codec, projections, (index, shards), through),
                daemon=True,
            )
            child.start()
            send.close()
            children.append((child, receive))
        mine = _progress(_shard_events(store, codec, (0, shards), through), progress, shards)
        parts = [fold(projections, mine)]
        for _, receive in children:
            kind, payload = receive.recv()
            if kind == "unshardable":
                raise _Unshardable
            if kind == "error":
                raise payload if isinstance(payload, BaseException) else RuntimeError(payload)
            parts.append(payload)
    finally:
        for child, receive in children:
            receive.close()
            child.join(5)
            if child.is_alive():
                child.kill()
                child.join()
    total = sum(n for n, _ in parts)
    return Rebuilt(total, merge(tables for _, tables in parts), shards)


def _fold_child(
    send: Connection,
    state_dir: Path,
    codec: EventCodec,
    projections: list[Process[Any]],
    shard: tuple[int, int],
    through: int,
) -> None:
    from callgate.adapters.embedded.store import EmbeddedStore

    result: tuple[str, object]
    try:
        store = EmbeddedStore(state_dir, codec)  # its own connection: none crosses a fork
        result = ("ok", fold(projections, _shard_events(store, codec, shard, through)))
        store.close()
    except _Unshardable:
        result = ("unshardable", None)
    except BaseException as exc:  # reported to the parent, which raises it
        result = ("error", exc)
    try:
        send.send(result)
    except Exception as exc:  # e.g. an exception that does not pickle
        send.send(("error", f"{type(exc).__name__}: {exc}; in replay shard {shard}"))
    send.close()


def _shard_events(
    store: EmbeddedStore, codec: EventCodec, shard: tuple[int, int], through: int
) -> Iterator[Event]:
    """The events of one shard of the ``events`` log in log order, skipping what ``read_events``
    skips: rows that do not decode and events that do not belong on the topic (both
    dead-lettered by the runner, never seen by a projection)."""
    from callgate.adapters.avro_codec import MalformedEvent

    decode = codec.decode
    after = 0
    while rows := store.read_shard(EVENTS, shard, after, through, _PAGE):
        for seq, key, payload in rows:
            try:
                event = decode(payload)
            except MalformedEvent:
                continue
            if type(event).TOPIC != EVENTS:
                continue
            if event.partition_key != key and shard[1] > 1:
                raise _Unshardable(seq)
            yield event
        after = rows[-1][0]


def _progress(
    items: Iterator[Event], progress: Progress | None, shards: int = 1
) -> Iterator[Event]:
    return items if progress is None else progress(items, shards)
