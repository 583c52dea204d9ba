"""The order in which one embedded round visits its processes.

In order, but when a process appends what one before it answers (the invocations asking a
limit's usage, ADR 0079: ``callgate.domain.process_port.answered_by``), the round goes back
to that one at once and on in order from there, so the asking process takes the answer
before the processes after it (the projections) run. The outputs are those of the rounds
this saves (the same inputs in the same order per process), without their commits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from callgate.adapters.embedded.unit_writes import Appended
from callgate.domain.process_port import Process, answered_by

# How often a round goes back to a process that answers before it commits: the hop to the
# usage process and back takes one; a call asked in that pass, one more. What is left waits
# for the next round.
PASSES_BACK = 2

Answers = frozenset[tuple[str, str | None]]  # (topic, event type)


def answers_of(process: Process[Any]) -> Answers:
    """What ``process`` answers, as (topic, event type) of the log rows that ask."""
    return frozenset((t.TOPIC, t.__name__) for t in answered_by(process))


def in_answer_order(
    answers: Sequence[Answers], visit: Callable[[int, bool], tuple[int, Appended]]
) -> int:
    """Visit the processes (``answers``: what each answers, in round order) and return the
    progress made. ``visit(index, first)`` runs one; ``first`` on its first visit of the
    round (its timers fire then); it returns its progress and what it appended."""
    progress, back, at, reached = 0, 0, 0, -1
    while at < len(answers):
        made, asked = visit(at, at > reached)
        progress += made
        reached = max(reached, at)
        earlier = next((i for i, a in enumerate(answers[:at]) if a & asked), None)
        if earlier is not None and back < PASSES_BACK:
            back, at = back + 1, earlier
        else:
            at += 1
    return progress
