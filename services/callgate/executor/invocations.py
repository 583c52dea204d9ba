"""The decider and the executor as one process per partition key (ADR 0077).

A call that needs no approval used to cross three transactions on Kafka: the decider's
(the decision and ``ExecutionRequested``), the executor's (``ExecutionStarted``) and the
executor's follow-up (the outcome), each a hand-off through the ``events`` topic. Every
event of an invocation carries its partition key, so the decider's and the executor's
states of one key live on one partition number: one process may hold both and hand the
decider's requests to the executor inside the same ``handle``. The critical path is then
two commits:

1. the decision, the requests it makes, what the executor answers to them at once
   (``ExecutionStarted``; a dry-run's or a description's result, which are read-only and
   which the decider folds in turn) and the input position: one transaction;
2. after that commit (C12: the start is durable before the provider is called),
   ``follow_up`` calls the provider; the outcome and the decider's settlement of it
   commit in the second.

Nothing of either rule changes: the decider stays pure and decides alone; the executor
runs only what the decider requested, at most once per run, and reconciles a started but
unfinished execution before anything else (``recover``). What changes is only who carries
an event from one to the other: this process, in order, instead of a topic.

Every event either part emits is still written to ``events`` (the audit trail, the views
and the callers read them there); this process does not react to them when it reads them
back (``reacts_to`` holds only what others write: requests and control events), since it
has already folded each one in the transaction that wrote it.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from callgate.decider.decider import Decider
from callgate.decider.state import DeciderState, state_from
from callgate.domain import events as ev
from callgate.domain.process_port import Output
from callgate.executor.executor import Executor, ExecutorState, executor_state_from

# The processes of the layout before this one, whose states ``invocations`` holds: a
# deployment they ran is taken over (embedded) or refused (Kafka), never started afresh.
EARLIER_LAYOUT = (Decider.name, Executor.name)


@dataclass(frozen=True, slots=True)
class InvocationsState:
    """One partition key's decider state and executor state (replaced, never changed in
    place: each part returns its new state)."""

    decider: DeciderState
    executor: ExecutorState


class Invocations:
    """Decides and executes the invocations of a partition key (see the module docstring)."""

    name = "invocations"
    inputs = frozenset({"requests", "events"})
    recovers = True

    def __init__(self, decider: Decider, executor: Executor) -> None:
        self.decider = decider
        self.executor = executor
        to_decider = decider.reacts_to
        to_executor = executor.reacts_to
        # What each part takes from the other, inside one ``handle`` (never from the topic).
        self._to_decider = to_decider - to_executor
        self._to_executor = to_executor - to_decider
        # Control events reach both parts (the executor routes by published versions).
        self.control_events: tuple[type[ev.Event], ...] = tuple(
            dict.fromkeys((*decider.control_events, *executor.control_events))
        )
        self.control_keys: tuple[str, ...] = tuple(
            dict.fromkeys((*decider.control_keys, *executor.control_keys))
        )
        # Only what the two parts do not write themselves: client requests and control
        # events. Their own events come back from the log already folded.
        # The usage process's answers too (ADR 0079): another process writes them.
        self.reacts_to: frozenset[type[ev.Event]] = frozenset(
            {
                ev.ToolCallProposed,
                ev.ApprovalDecisionSubmitted,
                ev.UsageReserved,
                ev.UsageRefused,
                *self.control_events,
            }
        )
        # The events one part hands the other: folded as they are written, never read back.
        self.carries: frozenset[type[ev.Event]] = (
            self._to_decider | self._to_executor
        ) - self.reacts_to

    def seed(self, events: Sequence[ev.Event]) -> None:
        self.decider.seed(events)
        self.executor.seed(events)

    # -- Process protocol ----------------------------------------------------------------

    def initial_state(self) -> InvocationsState:
        return InvocationsState(self.decider.initial_state(), self.executor.initial_state())

    def dump_state(self, state: InvocationsState) -> bytes:
        # Sorted-key JSON like each part's own (equal states, equal bytes).
        return b"".join(
            (
                b'{"decider":',
                self.decider.dump_state(state.decider),
                b',"executor":',
                self.executor.dump_state(state.executor),
                b"}",
            )
        )

    def load_state(self, data: bytes) -> InvocationsState:
        raw: dict[str, Any] = json.loads(data)
        return InvocationsState(state_from(raw["decider"]), executor_state_from(raw["executor"]))

    def next_due(self, state: InvocationsState) -> int | None:
        return self.decider.next_due(state.decider)

    def handle(
        self, state: InvocationsState, event: ev.Event, now_ms: int
    ) -> tuple[InvocationsState, Sequence[Output]]:
        if type(event) not in self.reacts_to:
            return state, ()  # its own event read back: folded when it was written
        if isinstance(event, self.control_events):
            decider, first = self.decider.handle(state.decider, event, now_ms)
            executor, more = self.executor.handle(state.executor, event, now_ms)
            return InvocationsState(decider, executor), [*first, *more]
        decider, out = self.decider.handle(state.decider, event, now_ms)
        return self._carry(replace(state, decider=decider), out, now_ms)

    def due(
        self, state: InvocationsState, now_ms: int
    ) -> tuple[InvocationsState, Sequence[Output]]:
        decider, out = self.decider.due(state.decider, now_ms)
        return self._carry(replace(state, decider=decider), out, now_ms)

    def follow_up(
        self, state: InvocationsState, committed: Sequence[ev.Event], now_ms: int
    ) -> tuple[InvocationsState, Sequence[Output]]:
        executor, out = self.executor.follow_up(state.executor, committed, now_ms)
        return self._carry(replace(state, executor=executor), out, now_ms)

    def recover(
        self, state: InvocationsState, now_ms: int
    ) -> tuple[InvocationsState, Sequence[Output]]:
        executor, out = self.executor.recover(state.executor, now_ms)
        return self._carry(replace(state, executor=executor), out, now_ms)

    def _carry(
        self, state: InvocationsState, first: Sequence[Output], now_ms: int
    ) -> tuple[InvocationsState, list[Output]]:
        """``first`` and everything it leads to: each event one part emits that the other
        reacts to is handled by it, in emission order, until neither emits more. Every
        event is returned (written to the log); each is handled here exactly once."""
        decider, executor = state.decider, state.executor
        outputs: list[Output] = []
        pending: deque[Output] = deque(first)
        while pending:
            item = pending.popleft()
            outputs.append(item)
            if not isinstance(item, ev.Event):
                continue  # a view record
            kind = type(item)
            if kind in self._to_executor:
                executor, out = self.executor.handle(executor, item, now_ms)
            elif kind in self._to_decider:
                decider, out = self.decider.handle(decider, item, now_ms)
            else:
                continue
            pending.extend(out)
        return InvocationsState(decider, executor), outputs


__all__ = ["EARLIER_LAYOUT", "Invocations", "InvocationsState"]
