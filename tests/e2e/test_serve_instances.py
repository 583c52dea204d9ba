"""Many ``callgate serve`` instances on one deployment (ADR 0015), on Apache Kafka.

Two instances with their own ``--instance-id`` share one state directory (its keys and the
simulated providers' ledger are the deployment's) and the partitions of every process;
neither fences the other. After a SIGKILL of one whole instance (serve and its children, as
a lost host) the other takes over its partitions: the time from the SIGKILL until a call on
every partition has settled again is printed and bounded by ``TAKEOVER_BOUND_S``. A second
serve with an instance id already running on the same state directory is refused.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from callgate.adapters.kafka.checkpoint import TRANSACTION_TIMEOUT_MS
from tests.kafka_support import (
    CODEC,
    PARTITIONS,
    WORKER_NAMES,
    Broker,
    Deployment,
    KafkaServe,
    Pair,
    token,
    unique_prefix,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

SESSION_TIMEOUT_S = 6.0  # tests.kafka_support.FAST_GROUPS
# Detection (session timeout), the lost instance's open transaction timing out (it holds
# back read_committed readers and its partitions' committed offsets), the broker's abort
# check, the rebalance and restore: ADR 0015.
TAKEOVER_BOUND_S = SESSION_TIMEOUT_S + TRANSACTION_TIMEOUT_MS / 1000 + 10.0


def members(dep: Deployment, process: str) -> list[str]:
    """The client ids (``<process>.<instance>``) of a process's group, once it is stable."""
    admin = AdminClient({"bootstrap.servers": dep.bootstrap})
    group = dep.topics.group(process)
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    if desc.state != ConsumerGroupState.STABLE:
        return []
    return sorted(m.client_id for m in desc.members if m.assignment.topic_partitions)


def read_everywhere(dep: Deployment, timeout_s: float) -> set[int]:
    """Reads until one has settled on every partition of ``requests``; the partitions."""
    gate = dep.connect()
    try:
        alice = token(gate, "alice", "acme", "support")
        ids: set[str] = set()
        covered: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while covered != set(range(PARTITIONS)) and time.monotonic() < deadline:
            left = max(1.0, deadline - time.monotonic())
            answer = gate.propose(alice, "tickets.read", {"ticket_id": "T-1"}, timeout_s=left)
            assert answer["outcome"] == "executed", answer
            ids.add(answer["invocation_id"])
            for record in dep.records("requests"):
                if CODEC.decode(record.value or b"").invocation_id in ids:
                    covered.add(record.partition)
        return covered
    finally:
        gate.close()


def test_two_instances_share_the_partitions_and_take_over_after_a_sigkill(
    pair: Pair, kafka_broker: Broker
) -> None:
    dep, _, b = pair

    def shared() -> bool:
        return all(
            members(dep, p) == [f"{p}.a", f"{p}.b"] for p in ("invocations", "status-projection")
        )

    wait_for(shared, 60, "both instances to own partitions of every process", poll_s=0.5)
    gate = dep.connect()
    try:
        alice = token(gate, "alice", "acme", "support")
        key = f"before-{uuid.uuid4().hex[:8]}"
        args = {"title": "shared", "requester_id": "alice"}
        made = gate.propose(alice, "tickets.create", args, idempotency_key=key)
        assert made["outcome"] == "executed", made
    finally:
        gate.close()

    killed = time.monotonic()
    b.kill_instance()
    assert read_everywhere(dep, TAKEOVER_BOUND_S + 30) == set(range(PARTITIONS))
    takeover = time.monotonic() - killed
    print(f"\ntakeover after SIGKILL of one instance: {takeover:.1f}s (bound {TAKEOVER_BOUND_S}s)")
    assert takeover < TAKEOVER_BOUND_S
    assert members(dep, "invocations") == ["invocations.a"]

    gate = dep.connect()
    try:  # exactly once across the loss: the same key replays, the ledger holds one effect
        again = gate.propose(alice, "tickets.create", args, idempotency_key=key)
        assert again["outcome"] == "replayed", again
        mine = [e for e in gate.effects() if e["invocation_id"] == made["invocation_id"]]
        assert len(mine) == 1, mine
    finally:
        gate.close()


def test_a_second_serve_with_a_running_instance_id_is_refused(pair: Pair, tmp_path: Path) -> None:
    dep, _, _ = pair
    clash = KafkaServe(dep, tmp_path / "clash.log", instance_id="a")
    code = clash.proc.wait(timeout=60)
    clash.stop()
    assert code == 1
    assert "another callgate serve runs as instance 'a'" in clash.log.read_text()


def test_children_stop_when_their_serve_is_killed(kafka_broker: Broker, tmp_path: Path) -> None:
    """A SIGKILLed serve leaves no orphan worker holding its partitions: each child gets
    SIGTERM when its supervisor dies (``worker.stop_with_parent``)."""
    dep = Deployment(kafka_broker.bootstrap, unique_prefix("orphans"), tmp_path / "state")
    serve = KafkaServe(dep, tmp_path / "serve.log", instance_id="lone")
    try:
        serve.wait_started()
        wait_for(lambda: len(serve.worker_pids()) == len(WORKER_NAMES), 30, "every child")
        children = serve.worker_pids()
        serve.proc.kill()
        serve.proc.wait(timeout=10)
    finally:
        serve.stop()  # a failure above must not leave the supervisor and its children

    def gone() -> bool:
        return not any(Path(f"/proc/{pid}").exists() for pid in children)

    wait_for(gone, 30, "the orphaned children to stop")
