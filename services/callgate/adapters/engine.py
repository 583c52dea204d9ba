"""The one engine every runner drives (docs/adr/0028-one-engine.md).

What happens to one input is the same on Kafka, on the embedded store and in memory:

1. **decode** once, checking the event belongs on the topic it came from
   (``decode_input``; a client must not inject service events through ``requests``);
2. **filter**: a type the process does not react to is consumed unhandled (``reacts``;
   ``handle`` would change nothing: ``process.reacts_to``);
3. **handle**, classified (``react``): a transient failure propagates (the runner rolls
   its transaction back and retries), a deterministic one is returned so the runner
   undoes the key's state (``restore``) and **dead-letters** the input with the reason
   (``failures.dead_letter``, ``failures.answers``);
4. the committed states stay in a **state cache** of one size (``StateCache``);
5. after the commit, ``follow_up`` runs for the keys that emitted events.

A runner is only its I/O and transaction boundary around these steps: Kafka transactions
(``kafka.runner``), SQLite transactions (``embedded.runner``), a Python list (``memory``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from callgate.adapters.avro_codec import MalformedEvent
from callgate.adapters.failures import Deterministic, Transient, classify
from callgate.domain.events import Event
from callgate.domain.process import Output, Process

if TYPE_CHECKING:
    from callgate.tracing import Tracing

K = TypeVar("K", bound=Hashable)

# Committed states each runner keeps per process, with their stored bytes (one size for
# every runner: an evicted key costs one read from the store). A burst of proposals reaches
# the decider's later events only after its requests, so the cache must hold a burst's keys:
# with 4,096, a 10,000-proposal burst read most states back.
STATE_CACHE_KEYS = 16_384


class StateCache(Generic[K]):
    """One process's committed state objects by key, with the bytes stored for each
    (``None``: never stored). Bounded, least recently used first out. ``take`` hands the
    object to a transaction (which may change it in place); ``keep`` puts the committed
    states back after the commit."""

    __slots__ = ("_entries", "limit")

    def __init__(self, limit: int = STATE_CACHE_KEYS) -> None:
        self.limit = limit
        self._entries: OrderedDict[K, tuple[Any, bytes | None]] = OrderedDict()

    def take(self, key: K) -> tuple[Any, bytes | None] | None:
        return self._entries.pop(key, None)

    def keep(self, committed: Iterable[tuple[K, Any, bytes | None]]) -> None:
        entries = self._entries
        for key, state, blob in committed:
            entries[key] = (state, blob)
            entries.move_to_end(key)
        while len(entries) > self.limit:
            entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


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


def restore(process: Process[Any], blob: bytes | None, handled: Sequence[Event], now: int) -> Any:
    """Undo a failed ``handle`` (it may have changed the state in place before raising):
    the stored state, with the events the transaction handled before for the key applied
    again. ``handle`` is deterministic: their outputs (already kept) are not emitted again."""
    state = process.load_state(blob) if blob is not None else process.initial_state()
    for event in handled:
        state, _ = process.handle(state, event, now)
    return state


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
