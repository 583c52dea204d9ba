"""The one engine every runner drives (docs/adr/0028-one-engine.md).

What happens to one input is the same on Kafka, on the embedded store and in memory:

1. **decode** once, checking the event belongs on the topic it came from
   (``decode_input``; a client must not inject service events through ``requests``);
2. **filter**: a type the process does not react to is consumed unhandled (``reacts``;
   ``handle`` would change nothing: ``process.reacts_to``);
3. **handle**, classified (``react``, ``handle_input``): a transient failure propagates
   (the runner rolls its transaction back and retries), a deterministic one undoes the
   key's state (``UnitOfWork.reset``) and **dead-letters** the input with the reason
   (``dropped``, ``malformed``);
4. **timers** (``fire_due``) and **recovery** (``recover_keys``) fold into the same unit of
   work (``callgate.adapters.unit_of_work``), whose committed states go back to a
   **state cache** of one size;
5. after the commit, ``follow_up`` runs for the keys that emitted events, round after
   round, each round committed, until one emits none (``follow_ups``).

A runner is only its I/O and transaction boundary around these steps: Kafka transactions
(``kafka.runner``), SQLite transactions (``embedded.runner``), a Python list (``memory``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from callgate.adapters.avro_codec import MalformedEvent
from callgate.adapters.failures import (
    Deterministic,
    Transient,
    answers,
    classify,
    dead_letter,
)
from callgate.adapters.unit_of_work import Read, UnitOfWork
from callgate.domain.codes import Code
from callgate.domain.events import Event, EventDeadLettered
from callgate.domain.process_port import Output, Process

if TYPE_CHECKING:
    from callgate.tracing import Tracing

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")
# (topic, partition, offset): where an input was read (the embedded log: partition 0, seq).
Source = tuple[str, int, int]


def decode_input(decode: Callable[[bytes], Event], payload: bytes, topic: str) -> Event:
    """The event of a record read from ``topic`` (the logical name); ``MalformedEvent``
    when it does not decode or does not belong on that topic (fail closed)."""
    event = decode(payload)
    if topic != type(event).TOPIC:
        raise MalformedEvent(f"{event.event_type} does not belong on topic {topic}")
    return event


def reacts(wanted: frozenset[type[Event]] | None, event: Event) -> bool:
    """Whether ``handle`` can change anything for ``event`` (``None``: every type)."""
    return wanted is None or type(event) in wanted


def react(
    process: Process[Any],
    load: Callable[[], Any],
    event: Event,
    now: int,
    keep: Callable[[Any, Sequence[Output]], None],
) -> Deterministic | None:
    """``handle`` one input on the key's state (``load``: from the runner's transaction,
    cache or store) and ``keep`` the new state and outputs (the runner's bookkeeping: it may
    encode them). Loading, handling and keeping fail alike: a transient failure propagates,
    a deterministic one is returned, with nothing kept."""
    try:
        new_state, outputs = process.handle(load(), event, now)
        keep(new_state, outputs)
    except Exception as exc:  # classified: a poison input must not stop the stream
        failure = classify(exc)
        if isinstance(failure, Transient):
            raise
        return failure
    return None


def follow_up_round(
    process: Process[Any],
    emitted: Mapping[K, Sequence[Event]],
    state_of: Callable[[K], Any],
    keep: Callable[[K, Any, Sequence[Output]], None],
    now: int,
    tracing: Tracing | None = None,
) -> None:
    """One round of ``follow_up``: for each key, the events its last commit made durable,
    on the key's committed state (``state_of`` starts the next transaction from it); the
    runner ``keep``s the results and commits them, then calls again for what that commit
    emitted, until a round emits none. A crash between the commits loses no input: the
    process's ``recover`` finds the started-but-unfinished work on restart (C12)."""
    for key, committed in emitted.items():
        if tracing is None:
            state, outputs = process.follow_up(state_of(key), committed, now)
        else:  # the invocation's context is current: the provider's span continues it
            with tracing.following(committed) as note:
                state, outputs = process.follow_up(state_of(key), committed, now)
                note(outputs)
        keep(key, state, outputs)


def spans_of(tracing: Tracing | None, process: str) -> Tracing | None:
    """``tracing`` for the spans around ``process``'s ``handle``: None for a process no call
    is followed through (``Tracing.follows``)."""
    return tracing if tracing is not None and tracing.follows(process) else None


def handle_input(
    unit: UnitOfWork[K, Any],
    key: K,
    event: Event,
    now: int,
    load: Callable[[], Any],
    tracing: Tracing | None = None,
    traceparent: Callable[[], str | None] = lambda: None,
) -> Deterministic | None:
    """``handle`` one input into ``unit`` (``react``); on a deterministic failure the key's
    state is undone (``UnitOfWork.reset``, nothing handled again) and the failure returned
    for the runner to drop the input. With ``tracing``, the call is a span continuing the
    invocation's context (``traceparent``, read only then)."""

    def loaded() -> Any:
        state = load()
        unit.mark(key)
        return state

    if tracing is None:
        failure = react(unit.process, loaded, event, now, lambda s, o: unit.keep(key, s, o))
    else:
        with tracing.handling(unit.process.name, event, traceparent()) as note:

            def keep_noted(state: Any, outputs: Sequence[Output]) -> None:
                unit.keep(key, state, outputs)
                note(outputs)

            failure = react(unit.process, loaded, event, now, keep_noted)
    if failure is not None:
        unit.reset(key)
    return failure


def dropped(
    event_id: str, source: Source, original: bytes, event: Event, failure: Deterministic,
    producer: str, now: int,
) -> list[Event]:  # fmt: skip
    """What an input ``handle`` cannot process leaves: its dead letter with the reason and,
    for a client request, the caller's coded outcome (``failures.answers``). ``event_id``
    derives from where the input was read: a re-run after a crash names it the same."""
    dead = dead_letter(
        event_id, event.invocation_id, event.partition_key, producer, now, failure, source,
        original,
    )  # fmt: skip
    return [dead, *answers(event, failure, producer, now)]


def malformed(
    event_id: str, source: Source, original: bytes, keys: tuple[str, str], producer: str,
    reason: str, now: int,
) -> EventDeadLettered:  # fmt: skip
    """The dead letter of an input that does not decode, or is on the wrong topic (``keys``:
    the invocation id and the partition key its record names, as far as it names them)."""
    invocation_id, partition_key = keys
    topic, partition, offset = source
    return EventDeadLettered(
        event_id=event_id,
        invocation_id=invocation_id,
        partition_key=partition_key,
        occurred_at=now,
        producer=producer,
        code=Code.MALFORMED_EVENT.value,
        reason=reason,
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        original=original,
    )


def add_dropped(unit: UnitOfWork[Any, Any], events: Sequence[Event]) -> None:
    """Add a dropped input's records: its dead letter, then each answer that encodes (an
    answer under ids that cannot be encoded is left out: the dead letter records the input)."""
    dead, *rest = events
    unit.add([dead])
    for answer in rest:
        try:
            unit.add([answer])
        except MalformedEvent:
            continue


def fire_due(
    unit: UnitOfWork[K, Any], keys: Iterable[K], read: Read[K], now: int, limit: int
) -> set[K]:
    """``due`` for the ``keys`` whose timer is due at ``now`` (at most ``limit`` of them),
    into ``unit``; returns the keys whose ``due`` emitted outputs. A key whose state no
    longer has the timer due (this unit moved it) is skipped: the commit indexes its new one."""
    process, fired, tried = unit.process, set[K](), 0
    for key in keys:  # ``keys`` may be lazy: never asked for one more past the limit
        state = unit.get(key, read)
        due = process.next_due(state)
        if due is None or due > now:
            continue
        tried += 1
        state, outputs = process.due(state, now)
        unit.keep(key, state, outputs)
        if outputs:
            fired.add(key)
        if tried >= limit:
            break
    return fired


def recover_keys(unit: UnitOfWork[K, Any], stored: Iterable[tuple[K, bytes]], now: int) -> None:
    """``recover`` each stored key into ``unit`` (on taking ownership, before new input:
    the work a crash left started but unfinished, C12)."""
    process = unit.process
    for key, blob in stored:
        state = process.load_state(blob)
        unit.seed(key, state, blob)
        state, outputs = process.recover(state, now)
        unit.keep(key, state, outputs)


def follow_ups(
    units: Sequence[UnitOfWork[K, R]],
    following: Callable[[UnitOfWork[K, R]], UnitOfWork[K, R]],
    commit: Callable[[Sequence[UnitOfWork[K, R]]], None],
    now: int,
    tracing: Tracing | None = None,
    owned: Callable[[K], bool] = lambda key: True,
) -> None:
    """``follow_up`` for what the committed ``units`` emitted, round after round: each
    round's units (``following`` makes one per process) are committed together (``commit``),
    then followed up in turn, until a round emits none. A crash between the commits loses
    no input: the process's ``recover`` finds the started-but-unfinished work (C12)."""
    pending = [u for u in units if u.emitted]
    while pending:
        nexts: list[UnitOfWork[K, R]] = []
        for done in pending:
            nxt = following(done)

            def state_of(key: K, done: UnitOfWork[K, R] = done, nxt: UnitOfWork[K, R] = nxt) -> Any:
                nxt.seed(key, done.states[key], done.stored[key])
                return done.states[key]

            emitted = {k: v for k, v in done.emitted.items() if owned(k)}
            follow_up_round(done.process, emitted, state_of, nxt.keep, now, tracing)
            nexts.append(nxt)
        commit(nexts)
        pending = [u for u in nexts if u.emitted]
