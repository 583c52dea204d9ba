"""``callgate freeze`` / ``unfreeze`` on Apache Kafka with two ``serve`` instances (issue 29,
part 4; ADR 0054, 0064), through the command line.

The freeze event lands on one partition of ``events``; the decider workers of both
instances read it from there (their global input), so a call on every partition, whichever
instance decides it, is refused ``frozen`` within the target of the event, and an unfreeze
restores them all. One prober per partition proposes ``tickets.create`` without pause, each
under fresh idempotency keys chosen to land on its partition.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from callgate.adapters.kafka.client import partition_for
from callgate.domain.canonical import partition_key
from tests.e2e.test_serve_instances import members
from tests.kafka_support import (
    PARTITIONS,
    Broker,
    Deployment,
    KafkaServe,
    cg,
    cli_ops,
    token,
    unique_prefix,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

TARGET_S = 1.0
TICKET = {"title": "printer on fire", "requester_id": "alice"}


@pytest.fixture
def pair(kafka_broker: Broker, tmp_path: Path) -> Iterator[Deployment]:
    dep = Deployment(kafka_broker.bootstrap, unique_prefix("freeze"), tmp_path / "state")
    a = KafkaServe(dep, tmp_path / "a.log", instance_id="a")
    b = KafkaServe(dep, tmp_path / "b.log", instance_id="b")
    try:
        a.wait_ready()
        b.wait_ready()
        yield dep
    finally:
        b.stop()
        code = a.stop()
    assert code == 0, a.log.read_text()


def key_on(partition: int) -> str:
    """A fresh idempotency key whose invocation lands on ``partition`` (tenant ``acme``)."""
    while True:
        key = uuid.uuid4().hex
        if partition_for(partition_key("acme", key, "").encode(), PARTITIONS) == partition:
            return key


class Prober:
    """Proposes on one partition in a loop, noting each answer's time and outcome."""

    def __init__(self, dep: Deployment, partition: int) -> None:
        self.partition = partition
        self.answers: list[tuple[int, int, str]] = []  # (sent, answered) in ms, outcome
        self._gate = dep.connect()
        self._token = token(self._gate, "alice", "acme", "support")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            key = key_on(self.partition)
            sent = time.time_ns() // 1_000_000
            answer = self._gate.propose(self._token, "tickets.create", TICKET, idempotency_key=key)
            self.answers.append((sent, time.time_ns() // 1_000_000, str(answer["outcome"])))

    def seen_after(self, since_ms: int, outcome: str, timeout_s: float = 30.0) -> float:
        """Seconds from ``since_ms`` to the first answer after it with ``outcome``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for _, at, seen in list(self.answers):
                if at >= since_ms and seen == outcome:
                    return (at - since_ms) / 1000
            time.sleep(0.01)
        raise AssertionError(f"p{self.partition} never {outcome}: {self.answers[-5:]}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self._gate.close()


def test_a_freeze_stops_a_tool_on_two_instances_and_an_unfreeze_restores_it(
    pair: Deployment,
) -> None:
    dep = pair
    wait_for(
        lambda: members(dep, "decider") == ["decider.a", "decider.b"],
        60,
        "both instances to own decider partitions",
        poll_s=0.5,
    )
    ops = cli_ops(dep)
    probers = [Prober(dep, p) for p in range(PARTITIONS)]
    try:
        start_ms = time.time_ns() // 1_000_000
        for prober in probers:  # every partition decides, and runs the tool, before
            prober.seen_after(start_ms, "executed")

        frozen = cg(dep, "freeze", "--tool", "tickets.create", "--reason", "incident 7",
                    "--session", ops)  # fmt: skip
        assert frozen["event"] == "FreezeApplied"
        stopped = [p.seen_after(frozen["occurred_at"], "frozen") for p in probers]

        lifted = cg(dep, "unfreeze", "--tool", "tickets.create", "--reason", "fixed",
                    "--session", ops)  # fmt: skip
        assert lifted["event"] == "FreezeLifted"
        restored = [p.seen_after(lifted["occurred_at"], "executed") for p in probers]
    finally:
        for prober in probers:
            prober.stop()
    print(
        "\nfreeze on 2 instances, from the event to enforcement per partition: "
        + ", ".join(f"{s:.2f}s" for s in stopped)
        + "; unfreeze: "
        + ", ".join(f"{s:.2f}s" for s in restored)
    )
    assert max(stopped) <= TARGET_S, stopped
    assert max(restored) <= TARGET_S, restored
    # Once refused, a partition stays refused until the unfreeze: no instance forgot it.
    settled, lifted_at = frozen["occurred_at"] + TARGET_S * 1000, lifted["occurred_at"]
    for prober in probers:
        during = [o for sent, at, o in prober.answers if settled <= sent and at < lifted_at]
        assert during and set(during) == {"frozen"}, (prober.partition, during)
