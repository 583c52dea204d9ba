"""An in-memory runner: the processes over a Python list, for tests and property checks.

Same semantics as the durable runners (per-key state, outputs routed by topic,
``follow_up`` after the "commit", timers), with none of the durability. It also
lets tests deliver inputs out of order or twice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from callgate.events import Event
from callgate.process import Output, Process, ViewRecord


@dataclass
class MemoryLog:
    events: list[Event] = field(default_factory=list)
    views: dict[str, dict[str, str]] = field(default_factory=dict)

    def of(self, invocation_id: str) -> list[Event]:
        return [e for e in self.events if e.invocation_id == invocation_id]


class MemoryRunner:
    def __init__(self, processes: Sequence[Process[Any]], now_ms: int = 1_700_000_000_000) -> None:
        self.processes = list(processes)
        self.now_ms = now_ms
        self.log = MemoryLog()
        self._state: dict[tuple[str, str], Any] = {}
        self._queue: deque[Event] = deque()

    def publish(self, *events: Event) -> None:
        self._queue.extend(events)

    def run(self, max_steps: int = 100_000) -> None:
        """Deliver queued events (and what follows from them) until nothing is left."""
        steps = 0
        while self._queue:
            steps += 1
            if steps > max_steps:
                raise RuntimeError("the processes did not settle")
            event = self._queue.popleft()
            self.log.events.append(event)
            for proc in self.processes:
                if event.TOPIC in proc.inputs:
                    self._deliver(proc, event)

    def advance(self, ms: int) -> None:
        """Move the clock and fire due timers."""
        self.now_ms += ms
        for proc in self.processes:
            for (name, key), state in list(self._state.items()):
                if name != proc.name:
                    continue
                due = proc.next_due(state)
                if due is not None and due <= self.now_ms:
                    state, outs = proc.due(state, self.now_ms)
                    self._state[(name, key)] = state
                    self._route(outs)
        self.run()

    def restart(self, processes: Sequence[Process[Any]] | None = None) -> None:
        """Simulate a restart: state survives (it is durable); recover hooks run."""
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
        self.run()

    def _deliver(self, proc: Process[Any], event: Event) -> None:
        key = (proc.name, event.partition_key)
        state = self._state.get(key)
        if state is None:
            state = proc.initial_state()
        else:  # round-trip through bytes, as durable runners do
            state = proc.load_state(proc.dump_state(state))
        state, outs = proc.handle(state, event, self.now_ms)
        self._state[key] = state
        self._route(outs)
        self._follow(proc, event.partition_key, outs)

    def _follow(self, proc: Process[Any], pk: str, outs: Iterable[Output]) -> None:
        committed = [o for o in outs if isinstance(o, Event)]
        if not committed:
            return
        state, more = proc.follow_up(self._state[(proc.name, pk)], committed, self.now_ms)
        self._state[(proc.name, pk)] = state
        self._route(more)

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
