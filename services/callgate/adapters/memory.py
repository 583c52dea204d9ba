"""An in-memory runner: the processes over a Python list, for tests and property checks.

Same semantics as the durable runners (per-key state, outputs routed by topic,
``follow_up`` after the "commit", timers), with none of the durability. It also
lets tests deliver inputs out of order or twice (``Chaos``) and crash a process
between its commit and its ``follow_up`` (``crash_next_follow_up``).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from callgate.adapters.engine import dropped, follow_up_round, react, reacts
from callgate.domain.events import Event
from callgate.domain.process_port import Output, Process, ViewRecord, reacts_to

CrashMode = Literal["before", "after"]


@dataclass
class MemoryLog:
    events: list[Event] = field(default_factory=list)
    views: dict[str, dict[str, str]] = field(default_factory=dict)

    def of(self, invocation_id: str) -> list[Event]:
        return [e for e in self.events if e.invocation_id == invocation_id]


@dataclass
class Chaos:
    """Delivery faults a Kafka deployment can produce, for property tests.

        ``interleave``: events of different lanes (topic, partition key) are delivered in
        any order; one lane stays FIFO, as one Kafka partition does. ``duplicate``: the
        probability that an event is delivered a second time to every consumer (at-least-once
        delivery, which the processes must survive though Apache Kafka's transactions do not
    produce it). Each event is
        duplicated at most once, so a run always ends.
    """

    rng: random.Random
    interleave: bool = True
    duplicate: float = 0.0


@dataclass
class _Crash:
    mode: CrashMode
    trigger: type[Event]


class MemoryRunner:
    def __init__(
        self,
        processes: Sequence[Process[Any]],
        now_ms: int = 1_700_000_000_000,
        chaos: Chaos | None = None,
    ) -> None:
        self.processes = list(processes)
        self.now_ms = now_ms
        self.chaos = chaos
        self.log = MemoryLog()
        self._state: dict[tuple[str, str], Any] = {}
        self._queue: deque[Event] = deque()
        self._duplicated: set[str] = set()
        self._crashes: dict[str, _Crash] = {}
        self._down: dict[str, list[Event]] = {}  # crashed process -> events it has not seen

    def publish(self, *events: Event) -> None:
        self._queue.extend(events)

    @property
    def idle(self) -> bool:
        return not self._queue

    def run(self, max_steps: int = 100_000) -> None:
        """Deliver queued events (and what follows from them) until nothing is left."""
        steps = 0
        while self._queue:
            steps += 1
            if steps > max_steps:
                raise RuntimeError("the processes did not settle")
            self._step()

    def step(self, n: int = 1) -> int:
        """Deliver at most ``n`` queued events; return how many were delivered."""
        done = 0
        while self._queue and done < n:
            self._step()
            done += 1
        return done

    def advance(self, ms: int) -> None:
        """Move the clock and fire due timers."""
        self.tick(ms)
        self.run()

    def tick(self, ms: int) -> None:
        """Move the clock and fire due timers without delivering what they emit."""
        self.now_ms += ms
        for proc in self.processes:
            if proc.name in self._down:
                continue
            for (name, key), state in list(self._state.items()):
                if name != proc.name:
                    continue
                due = proc.next_due(state)
                if due is not None and due <= self.now_ms:
                    state, outs = proc.due(state, self.now_ms)
                    self._state[(name, key)] = state
                    self._route(outs)

    def crash_next_follow_up(
        self, process: str, mode: CrashMode = "before", trigger: type[Event] = Event
    ) -> None:
        """Crash ``process`` at its next ``follow_up`` whose committed outputs hold a ``trigger``.

        ``before``: it dies before doing the work (the executor never calls the provider).
        ``after``: the work happens (the provider applies the effect), then it dies before
        committing what the work produced. Either way its state stays as committed by
        ``handle``, and it consumes nothing more until ``restart``.
        """
        self._crashes[process] = _Crash(mode, trigger)

    def restart(self, processes: Sequence[Process[Any]] | None = None) -> None:
        """Simulate a restart: state survives (it is durable); recover hooks run first.

        A crashed process then consumes the events it missed while it was down.
        """
        if processes is not None:
            self.processes = list(processes)
        for proc in self.processes:
            if not proc.recovers:
                continue
            for (name, key), state in list(self._state.items()):
                if name == proc.name:
                    state = proc.load_state(proc.dump_state(state))
                    state, outs = proc.recover(state, self.now_ms)
                    self._state[(name, key)] = state
                    self._route(outs)
                    self._follow(proc, key, outs)
        down, self._down = self._down, {}
        for proc in self.processes:
            for event in down.get(proc.name, []):
                self._deliver(proc, event)
        self.run()

    def _step(self) -> None:
        event = self._pop()
        self.log.events.append(event)
        for proc in self.processes:
            if event.TOPIC not in proc.inputs:
                continue
            if proc.name in self._down:
                self._down[proc.name].append(event)
            else:
                self._deliver(proc, event)
        chaos = self.chaos
        if (
            chaos is not None
            and chaos.duplicate > 0.0
            and event.event_id not in self._duplicated
            and chaos.rng.random() < chaos.duplicate
        ):
            self._duplicated.add(event.event_id)
            self._queue.append(event)

    def _pop(self) -> Event:
        if self.chaos is None or not self.chaos.interleave:
            return self._queue.popleft()
        heads: dict[tuple[str, str], int] = {}
        for i, e in enumerate(self._queue):
            heads.setdefault((e.TOPIC, e.partition_key), i)
        index = self.chaos.rng.choice(sorted(heads.values()))
        event = self._queue[index]
        del self._queue[index]
        return event

    def _deliver(self, proc: Process[Any], event: Event) -> None:
        if not reacts(reacts_to(proc), event):
            return  # consumed: ``handle`` would change nothing (``process.reacts_to``)
        key = (proc.name, event.partition_key)

        def load() -> Any:
            # Round-trip stored state through bytes, as durable runners do.
            state = self._state.get(key)
            if state is None:
                return proc.initial_state()
            return proc.load_state(proc.dump_state(state))

        handled: list[tuple[Any, Sequence[Output]]] = []
        failure = react(proc, load, event, self.now_ms, lambda s, o: handled.append((s, o)))
        if failure is not None:  # the rule both durable runners apply (adapters/engine.py)
            seq = len(self.log.events)
            dead_id, source = f"dead-letter-{event.TOPIC}-{seq}", (event.TOPIC, 0, seq)
            self._route(dropped(dead_id, source, b"", event, failure, proc.name, self.now_ms))
            return
        [(state, outs)] = handled
        self._state[key] = state
        self._route(outs)
        self._follow(proc, event.partition_key, outs)

    def _follow(self, proc: Process[Any], pk: str, outs: Iterable[Output]) -> None:
        committed = [o for o in outs if isinstance(o, Event)]
        if not committed:
            return
        crash = self._crashes.get(proc.name)
        if crash is not None and any(isinstance(e, crash.trigger) for e in committed):
            del self._crashes[proc.name]
            self._down.setdefault(proc.name, [])
            if crash.mode == "after":  # the work happens on a copy; its results are lost
                copy = proc.load_state(proc.dump_state(self._state[(proc.name, pk)]))
                proc.follow_up(copy, committed, self.now_ms)
            return
        emitted: list[Output] = []

        def keep(key: tuple[str, str], state: Any, more: Sequence[Output]) -> None:
            self._state[key] = state
            self._route(more)
            emitted.extend(more)

        follow_up_round(
            proc, {(proc.name, pk): committed}, self._state.__getitem__, keep, self.now_ms
        )
        self._follow(proc, pk, emitted)  # until a round emits none, as the durable runners

    def _route(self, outs: Iterable[Output]) -> None:
        for out in outs:
            if isinstance(out, ViewRecord):
                view = self.log.views.setdefault(out.view, {})
                if out.value_json is None:
                    view.pop(out.key, None)
                else:
                    view[out.key] = out.value_json
            else:
                self._queue.append(out)

    def state_of(self, process: str, partition_key: str) -> Any:
        return self._state.get((process, partition_key))
