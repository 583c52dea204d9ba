"""Toy processes that stand in for the deciders in the runner tests.

The embedded (SQLite) and the Kafka runner tests drive the same toys, so both runners are
held to one commit sequence (outputs, state and input positions together) by the same
expectations. Every output's id is derived from its input, so work that a runner redoes
after an abort or a crash writes copies identical to what it wrote before.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from callgate.domain.events import (
    ApprovalExpired,
    Event,
    ExecutionStarted,
    ExecutionUncertain,
    ToolCallProposed,
)
from callgate.domain.process_port import Output, ViewRecord

S = TypeVar("S")


def proposal(i: int, key: str, occurred_at: int = 0) -> ToolCallProposed:
    """Input number ``i`` (event id ``in-{i}``, invocation ``inv-{i}``) under ``key``."""
    return ToolCallProposed(
        event_id=f"in-{i}",
        invocation_id=f"inv-{i}",
        partition_key=key,
        occurred_at=occurred_at,
        session_token="t",
        tool="tickets.read",
        args_json="{}",
    )


class Toy(Generic[S]):
    """What a toy does not exercise: no timers, no follow-up, nothing to recover."""

    recovers = False

    def due(self, state: S, now_ms: int) -> tuple[S, Sequence[Output]]:
        return state, []

    def next_due(self, state: S) -> int | None:
        return None

    def follow_up(
        self, state: S, committed: Sequence[Event], now_ms: int
    ) -> tuple[S, Sequence[Output]]:
        return state, []

    def recover(self, state: S, now_ms: int) -> tuple[S, Sequence[Output]]:
        return state, []


class Counting(Toy[int]):
    """Counts proposals per key; one ``ExecutionStarted`` (attempt = running count) each.

    ``fail_once_on``: event ids whose first ``handle`` raises a transient fault (an OSError,
    ``adapters/failures.py``): the runner aborts the batch and redoes it.
    """

    name = "counter"
    inputs = frozenset({"requests"})

    def __init__(self, fail_once_on: frozenset[str] = frozenset()) -> None:
        self._fail_once_on = set(fail_once_on)

    def initial_state(self) -> int:
        return 0

    def handle(self, state: int, event: Event, now_ms: int) -> tuple[int, Sequence[Output]]:
        if event.event_id in self._fail_once_on:
            self._fail_once_on.discard(event.event_id)
            raise ConnectionError(f"injected failure on {event.event_id}")  # transient
        n = state + 1
        out = ExecutionStarted(
            event_id=f"out-{event.event_id}",
            invocation_id=event.invocation_id,
            partition_key=event.partition_key,
            execution_token=event.event_id,
            attempt=n,
        )
        return n, [out, ViewRecord("counts", event.partition_key, json.dumps(n))]

    def dump_state(self, state: int) -> bytes:
        return str(state).encode()

    def load_state(self, data: bytes) -> int:
        return int(data)


class Recovering(Toy[tuple[str, int]]):
    """Counts per key as ``Counting`` does (state: key and count); ``recover`` reports each
    key it holds, as the executor reconciles started work when it takes ownership (C12)."""

    name = "recovering"
    inputs = frozenset({"requests"})
    recovers = True

    def __init__(self) -> None:
        self._counting = Counting()

    def initial_state(self) -> tuple[str, int]:
        return ("", 0)

    def handle(
        self, state: tuple[str, int], event: Event, now_ms: int
    ) -> tuple[tuple[str, int], Sequence[Output]]:
        n, outputs = self._counting.handle(state[1], event, now_ms)
        return (event.partition_key, n), outputs

    def recover(
        self, state: tuple[str, int], now_ms: int
    ) -> tuple[tuple[str, int], Sequence[Output]]:
        key, n = state
        report = ExecutionUncertain(
            event_id=f"rec-{key}-{n}", invocation_id="", partition_key=key,
            execution_token=str(n), reason="taking ownership",
        )  # fmt: skip
        return state, [report]

    def dump_state(self, state: tuple[str, int]) -> bytes:
        return json.dumps(list(state)).encode()

    def load_state(self, data: bytes) -> tuple[str, int]:
        key, n = json.loads(data)
        return str(key), int(n)


@dataclass(frozen=True)
class Deadline:
    """The one timer ``Expiring`` keeps per key."""

    key: str
    invocation_id: str
    expires_at: int


class Expiring(Toy[Deadline | None]):
    """Arms a timer 1 s after each proposal; ``due`` emits ``ApprovalExpired`` once."""

    name = "expiring"
    inputs = frozenset({"requests"})

    def initial_state(self) -> Deadline | None:
        return None

    def handle(
        self, state: Deadline | None, event: Event, now_ms: int
    ) -> tuple[Deadline | None, Sequence[Output]]:
        return Deadline(event.partition_key, event.invocation_id, event.occurred_at + 1000), []

    def next_due(self, state: Deadline | None) -> int | None:
        return None if state is None else state.expires_at

    def due(self, state: Deadline | None, now_ms: int) -> tuple[Deadline | None, Sequence[Output]]:
        assert state is not None and state.expires_at <= now_ms
        expired = ApprovalExpired(
            event_id=f"exp-{state.invocation_id}",
            invocation_id=state.invocation_id,
            partition_key=state.key,
            stage="pending",
        )
        return None, [expired]

    def dump_state(self, state: Deadline | None) -> bytes:
        if state is None:
            return b""
        return json.dumps([state.key, state.invocation_id, state.expires_at]).encode()

    def load_state(self, data: bytes) -> Deadline | None:
        return Deadline(*json.loads(data)) if data else None
