"""``callgate freeze`` / ``unfreeze`` on Apache Kafka with two ``serve`` instances (issue 29,
part 4; ADR 0054, 0064), through the command line.

The freeze event lands on one partition of ``events``; the decider workers of both
instances read it from there (their global input), so a call on every partition, whichever
instance decides it, is refused ``frozen`` within the target of the event (by the decider's
clock: the status view's ``updated_at`` of the first refusal), and an unfreeze restores
them all. One prober per partition proposes ``tickets.create`` without pause, each
under fresh idempotency keys chosen to land on its partition.
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

        lifted = cg(dep, "unfreeze", "--tool", "tickets.create", "--reason", "fixed",
                    "--session", ops)  # fmt: skip
        assert lifted["event"] == "FreezeLifted"
        at = lifted["occurred_at"]
        restored = [decided(reader, p.first(at, "executed")) - at for p in probers]
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
    assert max(stopped) <= TARGET_MS, stopped
    assert max(restored) <= TARGET_MS, restored
    # Once refused, a partition stays refused until the unfreeze: no instance forgot it.
    settled, lifted_at = frozen["occurred_at"] + TARGET_MS, lifted["occurred_at"]
    for prober in probers:
        during = [o for sent, at, o, _ in prober.answers if settled <= sent and at < lifted_at]
        assert during and set(during) == {"frozen"}, (prober.partition, during)
