"""What one transaction of one process carries, the same on every runner (ADRs 0028, 0091).

A runner opens a ``UnitOfWork`` per transaction (and per ``follow_up`` round), lets the
engine fold inputs, timers and recovery into it, and writes what it holds at its commit:
the encoded output records, in order, and the states that differ from the stored ones.
The runner decides only what a record is (a log row, a Kafka record) and how it is written.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from callgate.domain.events import Event
from callgate.domain.process_port import Output, Process, ViewRecord

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")

# Committed states each runner keeps per process, with their stored bytes (one size for
# every runner: an evicted key costs one read from the store). A burst of proposals reaches
# the decider's later events only after its requests, so the cache must hold a burst's keys:
# with 4,096, a 10,000-proposal burst read most states back.
STATE_CACHE_KEYS = 16_384
# ... but only the keys in use: a state untouched this long leaves the cache. A call's
# events follow one another within seconds, so under a steady load the cache holds about a
# minute of keys and stops growing within that minute, instead of filling to its bound over
# a quarter of an hour at 25 new keys a second (docs/explanation/soak.md "Resident memory").
STATE_CACHE_IDLE_S = 60.0


class StateCache(Generic[K]):
    """One process's committed state objects by key, with the bytes stored for each
    (``None``: never stored). Bounded: at most ``limit`` keys, none untouched for more than
    ``idle_s`` seconds of ``clock``, least recently used first out. ``take`` hands the
    object to a transaction (which may change it in place); ``keep`` puts the committed
    states back after the commit, so an aborted transaction never leaves uncommitted state
    here (the bounds: ``STATE_CACHE_KEYS``, ``STATE_CACHE_IDLE_S``)."""

    __slots__ = ("_clock", "_entries", "idle_s", "limit")

    def __init__(
        self,
        limit: int = STATE_CACHE_KEYS,
        idle_s: float = STATE_CACHE_IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.idle_s, self._clock = limit, idle_s, clock
        # In the order of use, so the least recently used (the oldest) entry is first.
        self._entries: OrderedDict[K, tuple[Any, bytes | None, float]] = OrderedDict()

    def take(self, key: K) -> tuple[Any, bytes | None] | None:
        entry = self._entries.pop(key, None)
        return None if entry is None else (entry[0], entry[1])

    def keep(self, committed: Iterable[tuple[K, Any, bytes | None]]) -> None:
        entries, now = self._entries, self._clock()
        for key, state, blob in committed:
            entries[key] = (state, blob, now)
            entries.move_to_end(key)
        while len(entries) > self.limit:
            entries.popitem(last=False)
        stale = now - self.idle_s
        while entries and next(iter(entries.values()))[2] < stale:
            entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


# Reads the stored bytes of keys (absent: never stored).
Read = Callable[[Sequence[K]], Mapping[K, bytes | None]]
# (key, blob, next_due): a state that differs from what is stored.
Change = tuple[K, bytes, int | None]


class UnitOfWork(Generic[K, R]):
    """Key states (with the bytes each started from), the records to write in order, the
    events each key emitted (for ``follow_up``) and, while a ``handle`` runs, the key's
    state as it was before it (to undo a failed ``handle``: ``mark`` and ``reset``).

    ``encode`` makes a runner's record of an output; every output of a step is encoded
    before any is kept, so one that cannot be encoded leaves the unit as it was. States
    come from ``cache`` first (the unit owns an object it took: a process may change it in
    place), else from the store. ``observe``: keep the view records for an observer.
    """

    __slots__ = (
        "_before",
        "_cache",
        "_changed",
        "_encode",
        "emitted",
        "immutable",
        "observe",
        "origin",
        "process",
        "records",
        "states",
        "stored",
        "views",
    )

    def __init__(
        self,
        process: Process[Any],
        encode: Callable[[Output], R],
        cache: StateCache[K],
        immutable: bool,
        observe: bool = False,
    ) -> None:
        self.process = process
        self.immutable = immutable
        self.observe = observe
        self._encode = encode
        self._cache = cache
        self.states: dict[K, Any] = {}
        self.origin: dict[K, Any] = {}  # the object each key started with
        self.stored: dict[K, bytes | None] = {}
        self.records: list[R] = []
        self.emitted: dict[K, list[Event]] = {}
        self.views: list[ViewRecord] = []
        self._changed: set[K] = set()  # kept since the stored bytes were last written
        self._before: dict[K, Any] = {}  # ``mark``: the state object, or its bytes

    # --- states ------------------------------------------------------------------------------

    def load(self, keys: Iterable[K], read: Read[K]) -> None:
        """Bring ``keys`` into the unit: from the cache of committed states, else ``read``."""
        missing: list[K] = []
        for key in dict.fromkeys(keys):
            if key in self.stored:
                continue
            cached = self._cache.take(key)
            if cached is None:
                missing.append(key)
            else:
                self.seed(key, *cached)
        if missing:
            process = self.process
            found = read(missing)
            for key in missing:
                blob = found.get(key)
                state = process.load_state(blob) if blob is not None else process.initial_state()
                self.seed(key, state, blob)

    def get(self, key: K, read: Read[K]) -> Any:
        """The state of ``key``, loaded first when the unit does not hold it yet."""
        if key not in self.stored:
            self.load((key,), read)
        return self.states[key]

    def seed(self, key: K, state: Any, blob: bytes | None) -> None:
        """Start ``key`` from a committed state (``blob``: its bytes, ``None`` if never
        stored). The unit owns the object: it leaves the cache until the commit."""
        self._cache.take(key)
        self.states[key] = self.origin[key] = state
        self.stored[key] = blob

    def mark(self, key: K) -> None:
        """Remember the state of ``key`` before a ``handle`` that may fail: the object
        itself when the process never changes a state in place, else its stored bytes, or
        (changed since they were written) the state dumped now."""
        if self.immutable:
            self._before[key] = self.states[key]
        elif key in self._changed:
            self._before[key] = self.process.dump_state(self.states[key])
        else:
            self._before.pop(key, None)

    def reset(self, key: K) -> None:
        """Undo a failed ``handle`` (it may have changed the state in place before
        raising): back to the state ``mark`` remembered. Nothing is handled again, so no
        provider is called again and no outcome can differ."""
        if key not in self.stored:
            self.states.pop(key, None)  # it never loaded: nothing to undo
            return
        process = self.process
        if key in self._before:
            before = self._before.pop(key)
            self.states[key] = before if self.immutable else process.load_state(before)
            return
        blob = self.stored[key]
        self.states[key] = process.load_state(blob) if blob is not None else process.initial_state()

    # --- outputs -----------------------------------------------------------------------------

    def keep(self, key: K, state: Any, outputs: Sequence[Output]) -> None:
        """Keep the new state of ``key`` and its ``outputs``, encoded (all or none)."""
        if outputs:
            encode = self._encode
            records = [encode(out) for out in outputs]
            self.records += records
            for out in outputs:
                if isinstance(out, ViewRecord):
                    if self.observe:
                        self.views.append(out)
                else:
                    self.emitted.setdefault(key, []).append(out)
        self.states[key] = state
        self._changed.add(key)

    def add(self, events: Iterable[Event]) -> None:
        """Records of no key's state (dead letters and answers of dropped inputs)."""
        self.records += (self._encode(event) for event in events)

    # --- the commit --------------------------------------------------------------------------

    def changes(self, initial_blob: bytes) -> list[Change[K]]:
        """``(key, blob, next_due)`` of the states that differ from the stored (or the
        initial) ones. An immutable-state process's key still holding the object it
        started with is unchanged by construction: not dumped."""
        process, origin, immutable, stored = self.process, self.origin, self.immutable, self.stored
        changed: list[Change[K]] = []
        for key, state in self.states.items():
            if immutable and state is origin[key]:
                continue
            blob = process.dump_state(state)
            before = stored[key]
            if blob != (initial_blob if before is None else before):
                changed.append((key, blob, process.next_due(state)))
        return changed

    def written(self, changes: Iterable[Change[K]]) -> None:
        """``changes`` and the records are written: the stored bytes match every key's
        state again, so the unit may go on (timers, then inputs of one round) and be
        written once more."""
        for key, blob, _ in changes:
            self.stored[key] = blob
        self.origin.update(self.states)
        self.records = []
        self._changed.clear()  # the stored bytes are the states again

    def committed(self) -> None:
        """After the commit: the unit's states are the committed ones; back to the cache."""
        stored = self.stored
        self._cache.keep((key, state, stored[key]) for key, state in self.states.items())

    @property
    def pending(self) -> bool:
        """Whether records wait to be written."""
        return bool(self.records)
