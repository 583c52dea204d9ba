"""``callgate freeze`` / ``unfreeze`` on Apache Kafka with two ``serve`` instances (issue 29,
part 4; ADR 0054, 0064), through the command line.

The freeze event lands on one partition of ``events``; the decider workers of both
instances read it from there (their global input), so a call on every partition, whichever
instance decides it, is refused ``frozen`` once that worker has read the event, and an
unfreeze restores them all the same way. One prober per partition proposes
``tickets.create`` without pause, each under fresh idempotency keys chosen to land on its
partition.

What is asserted is what a caller sees, per partition: once a call is refused after the
freeze, no later call runs until the unfreeze (no instance forgot it), and once a call
runs after the unfreeze, no later call is refused; each switch comes within
``SETTLED_MS``, a bound on liveness. How fast enforcement is (the 1 s target of ADR 0054)
is measured by ``make bench-freeze``, not here: on a test machine that runs two brokers
at once, one partition's switch has taken 1.1 s. The time from the event to the first
refusal (by the decider's clock: the status view's ``updated_at``) is printed.
"""

from __future__ import annotations

import time

import pytest

from callgate.surfaces.sdk import Gateway
from tests.e2e.test_serve_instances import members
from tests.kafka_support import (
    PARTITIONS,
    Pair,
    PartitionProber,
    cg,
    cli_ops,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

SETTLED_MS = 10_000


def decided(gate: Gateway, first: tuple[int, int, str]) -> int:
    """When the decider settled a probe's call: its status view's ``updated_at`` (the
    decider's clock), so the bound is on enforcement, not on the answer's way back."""
    status = gate.backend.view("status", first[2])
    assert status is not None, first
    return int(status["updated_at"])


def test_a_freeze_stops_a_tool_on_two_instances_and_an_unfreeze_restores_it(
    pair: Pair,
) -> None:
    dep, _, _ = pair
    wait_for(
        lambda: members(dep, "invocations") == ["invocations.a", "invocations.b"],
        60,
        "both instances to own invocations partitions",
        poll_s=0.5,
    )
    ops = cli_ops(dep)
    reader = dep.connect()
    probers = [PartitionProber(dep, p) for p in range(PARTITIONS)]
    try:
        start_ms = time.time_ns() // 1_000_000
        for prober in probers:  # every partition decides, and runs the tool, before
            prober.seen_after(start_ms, "executed")

        frozen = cg(dep, "freeze", "--tool", "tickets.create", "--reason", "incident 7",
                    "--session", ops)  # fmt: skip
        assert frozen["event"] == "FreezeApplied"
        at = frozen["occurred_at"]
        stopped = [decided(reader, p.first(at, "frozen")) - at for p in probers]

        for prober in probers:  # a call sent after the switch on every partition
            prober.first(prober.first(at, "frozen")[1], "frozen")

        lifted = cg(dep, "unfreeze", "--tool", "tickets.create", "--reason", "fixed",
                    "--session", ops)  # fmt: skip
        assert lifted["event"] == "FreezeLifted"
        at = lifted["occurred_at"]
        restored = [decided(reader, p.first(at, "executed")) - at for p in probers]
        for prober in probers:
            prober.first(prober.first(at, "executed")[1], "executed")
    finally:
        for prober in probers:
            prober.stop()
        reader.close()
    print(
        "\nfreeze on 2 instances, from the event to enforcement per partition: "
        + ", ".join(f"{ms} ms" for ms in stopped)
        + "; unfreeze: "
        + ", ".join(f"{ms} ms" for ms in restored)
    )
    # Per partition, in the order the prober sent them (one at a time): calls run, then
    # are refused from the first refusal until the unfreeze, then run from the first run.
    applied_at, lifted_at = frozen["occurred_at"], lifted["occurred_at"]
    for prober in probers:
        outcomes = [(sent, answered, o) for sent, answered, o, _ in prober.answers]
        stop_at = next(s for s, _, o in outcomes if s >= applied_at and o == "frozen")
        run_at = next(s for s, _, o in outcomes if s >= lifted_at and o == "executed")
        assert stop_at - applied_at <= SETTLED_MS and run_at - lifted_at <= SETTLED_MS
        during = {o for s, answered, o in outcomes if s >= stop_at and answered < lifted_at}
        after = {o for s, _, o in outcomes if s >= run_at}
        assert during == {"frozen"}, (prober.partition, outcomes)
        assert after == {"executed"}, (prober.partition, outcomes)
