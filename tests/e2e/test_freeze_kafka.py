"""``callgate freeze`` / ``unfreeze`` on Apache Kafka with two ``serve`` instances (issue 29,
part 4; ADR 0054, 0064), through the command line.

The freeze event lands on one partition of ``events``; the decider workers of both
instances read it from there (their global input), so a call on every partition, whichever
instance decides it, is refused ``frozen`` once the target has passed since the event,
and an unfreeze restores them all the same way. One prober per partition proposes
``tickets.create`` without pause, each under fresh idempotency keys chosen to land on its
partition.

The target is asserted on what a caller sees: every call sent at least ``TARGET_MS``
after the event has the new outcome. The time from the event to the first refusal (by
the decider's clock: the status view's ``updated_at``) is printed, not asserted: a prober
sends its next call only when its call in flight has its answer, so on a loaded machine
that time includes the in-flight call's own execution, not only the enforcement.
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

TARGET_MS = 1_000


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

        for prober in probers:  # a call sent past the target on every partition
            prober.first(at + TARGET_MS, "frozen")

        lifted = cg(dep, "unfreeze", "--tool", "tickets.create", "--reason", "fixed",
                    "--session", ops)  # fmt: skip
        assert lifted["event"] == "FreezeLifted"
        at = lifted["occurred_at"]
        restored = [decided(reader, p.first(at, "executed")) - at for p in probers]
        for prober in probers:
            prober.first(at + TARGET_MS, "executed")
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
    # Every call sent past the target after the freeze is refused until the unfreeze (no
    # instance forgot it), and every call sent past the target after the unfreeze runs.
    settled, lifted_at = frozen["occurred_at"] + TARGET_MS, lifted["occurred_at"]
    for prober in probers:
        during = [o for sent, at, o, _ in prober.answers if settled <= sent and at < lifted_at]
        assert during and set(during) == {"frozen"}, (prober.partition, during)
        after = [o for sent, _, o, _ in prober.answers if sent >= lifted_at + TARGET_MS]
        assert after and set(after) == {"executed"}, (prober.partition, after)
