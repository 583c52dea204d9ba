"""A broker restart under a running ``callgate serve``, on Apache Kafka (docs/contract.md,
"Kafka client errors").

The broker's JVM is SIGKILLed while callers keep proposing, and started again on its data
after an outage; ``serve`` is never touched. Once the broker is back, a new call executes
within ``BACK_WITHIN_S``, and every call published before, during and after the outage
settles exactly once with no operator action: lost 0, double 0, audit chain and replay
equal. Meanwhile no answer says ``allowed`` for a call no policy decided: a call that could
not be published is ``broker_unavailable``, one published and not decided yet is
``pending_decision``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tools.apache_kafka import ApacheKafka

from callgate.application.replay import replay
from callgate.domain import events as ev
from callgate.domain.codes import Code, Rejection
from tests.kafka_support import (
    Deployment,
    KafkaServe,
    operator,
    require_broker,
    token,
    unique_prefix,
)

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

BACK_WITHIN_S = 30.0  # from the broker answering again to a new call executed
SETTLE_WITHIN_S = 120.0  # every call published meanwhile settled, after that
CALL_TIMEOUT_S = 5.0


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[ApacheKafka]:
    """A broker of this test alone: it is killed and started again on its data."""
    require_broker()
    server = ApacheKafka(data_dir=tmp_path / "kafka")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class Calls:
    """What callers were answered: per idempotency key, the invocation id (None: nothing
    published) and every outcome seen."""

    answers: dict[str, tuple[str | None, str, float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, key: str, invocation_id: str | None, outcome: str) -> None:
        with self.lock:
            self.answers[key] = (invocation_id, outcome, time.monotonic())

    def executed_after(self, moment: float) -> float | None:
        """The earliest time after ``moment`` a call was answered ``executed``."""
        with self.lock:
            times = [t for _, o, t in self.answers.values() if o == "executed" and t > moment]
        return min(times, default=None)


def caller(dep: Deployment, calls: Calls, stop: threading.Event, name: str) -> None:
    """Proposes ``tickets.create`` (one effect per executed call) until ``stop``, each with
    its own idempotency key, through one SDK client made before the outage."""
    gate = dep.connect()
    try:
        session = token(gate, name, "acme", "support")
        n = 0
        while not stop.is_set():
            n += 1
            key = f"{name}-{n}-{uuid.uuid4().hex[:6]}"
            args = {"title": f"ticket {key}", "requester_id": name}
            try:
                answer = gate.propose(
                    session, "tickets.create", args, key, timeout_s=CALL_TIMEOUT_S
                )
            except Rejection as exc:  # nothing was published
                assert exc.code is Code.BROKER_UNAVAILABLE, exc
                calls.add(key, None, exc.code.value)
                stop.wait(0.5)
                continue
            calls.add(key, answer.get("invocation_id"), str(answer["outcome"]))
            stop.wait(0.2)
    finally:
        gate.close()


def restart_broker_under_load(
    server: ApacheKafka, tmp_path: Path, instances: int, outage_s: float
) -> None:
    dep = Deployment(server.bootstrap, unique_prefix("restart"), tmp_path / "state")
    serves = [
        KafkaServe(dep, tmp_path / f"serve-{n}.log", instance_id=f"i{n}") for n in range(instances)
    ]
    for serve in serves:
        serve.wait_ready()
    calls, stop = Calls(), threading.Event()
    threads = [
        threading.Thread(target=caller, args=(dep, calls, stop, f"caller{n}"), daemon=True)
        for n in range(2)
    ]
    gate = dep.connect()
    try:
        for thread in threads:
            thread.start()
        time.sleep(3.0)  # calls before the outage
        assert calls.executed_after(0.0) is not None, calls.answers
        server.kill()
        time.sleep(outage_s)  # calls during it
        server.start()
        back_at = time.monotonic()
        while calls.executed_after(back_at) is None:
            assert time.monotonic() - back_at < BACK_WITHIN_S, (
                f"no call executed within {BACK_WITHIN_S}s of the broker's return: "
                f"{serves[0].diagnosis([s.log for s in serves])}"
            )
            time.sleep(0.2)
        first = (calls.executed_after(back_at) or 0.0) - back_at
        time.sleep(2.0)  # calls after it
        stop.set()
        for thread in threads:
            thread.join(timeout=CALL_TIMEOUT_S * 3)
        answers = dict(calls.answers)
        published = {k: inv for k, (inv, _, _) in answers.items() if inv is not None}
        outcomes = Counter(o for _, o, _ in answers.values())
        expected = {"executed", "allowed", "pending_decision", "broker_unavailable"}
        assert set(outcomes) <= expected, outcomes
        assert outcomes["pending_decision"] + outcomes["broker_unavailable"] > 0, outcomes

        def settled() -> bool:
            views = (gate.backend.view("status", inv) or {} for inv in published.values())
            return all(v.get("settled") for v in views)

        started = time.monotonic()
        assert gate.backend.wait(settled, SETTLE_WITHIN_S), serves[0].diagnosis(
            [s.log for s in serves]
        )
        settle_s = time.monotonic() - started
        statuses = {k: gate.backend.view("status", inv) or {} for k, inv in published.items()}
        lost = sorted(k for k, s in statuses.items() if s.get("outcome") != "executed")
        effects = Counter(
            e["invocation_id"] for e in gate.effects() if e["invocation_id"] in published.values()
        )
        double = sorted(inv for inv, n in effects.items() if n > 1)
        missing = sorted(k for k, inv in published.items() if effects[inv] == 0)
        ops = operator(gate)
        ids = set(published.values())

        def audited() -> bool:
            seen = {r["invocation_id"] for r in gate.audit(session=ops)}
            return ids <= seen and gate.verify_audit().ok and bool(replay(gate)["equal"])

        audit_ok = gate.backend.wait(audited, 60)
        print(
            f"\nbroker restart ({instances} instance(s), outage {outage_s:g} s): first call "
            f"executed {first:.1f} s after the broker was back; {len(published)} published "
            f"calls settled {settle_s:.1f} s later; answers {dict(outcomes)}; lost "
            f"{len(lost)}, double {len(double)}, audit and replay equal: {audit_ok}"
        )
        # Fail closed in words: ``allowed`` (in progress) only for a call a policy permitted.
        permitted = {
            e.invocation_id
            for _, e in dep.events()
            if isinstance(e, ev.PolicyDecided) and e.decision == "permit"
        }
        said_allowed = {inv for inv, o, _ in answers.values() if o == "allowed"}
        assert said_allowed <= permitted, said_allowed - permitted
        assert not lost, {k: statuses[k] for k in lost[:5]}
        assert not missing, missing  # executed, yet no effect
        assert audit_ok
        if double:
            # Apache Kafka's (ADR 0087): a single broker's crash can drop the markers of the
            # transactions its coordinator completes after the restart, and the next
            # transaction commits an aborted batch. A cluster keeps it (chaos --cluster 3).
            pytest.xfail(
                f"Apache Kafka drops transaction markers across a single broker's crash "
                f"(ADR 0087): {len(double)} call(s) applied twice: {double}"
            )
    finally:
        stop.set()
        gate.close()
        for serve in serves:
            assert serve.stop() == 0, serve.log.read_text()[-2000:]


def test_one_instance_recovers_from_a_broker_restart_by_itself(
    own_broker: ApacheKafka, tmp_path: Path
) -> None:
    restart_broker_under_load(own_broker, tmp_path, instances=1, outage_s=5.0)


def test_two_instances_recover_from_a_broker_restart_by_themselves(
    own_broker: ApacheKafka, tmp_path: Path
) -> None:
    restart_broker_under_load(own_broker, tmp_path, instances=2, outage_s=5.0)


def test_a_broker_away_for_a_minute_loses_nothing(own_broker: ApacheKafka, tmp_path: Path) -> None:
    restart_broker_under_load(own_broker, tmp_path, instances=1, outage_s=60.0)
