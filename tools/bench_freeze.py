"""``make bench-freeze`` (``python -m tools bench --only freeze``): the time from
``callgate freeze`` to enforcement on a running ``callgate serve`` (embedded store), and on
every partition of two ``serve`` instances on Apache Kafka (``--backend``).

A ``serve`` subprocess decides; a prober in this process proposes ``tickets.create``
without pause. Each round runs ``callgate freeze`` then ``callgate unfreeze`` as commands
(subprocesses) and measures, for each, the time from the event's ``occurred_at`` to the
first answer that shows it (``frozen``, then ``executed`` again), and from the command's
start (process start-up included). Target: at most 1 s from the event.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from callgate.bootstrap import Settings
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.sdk import Gateway, connect
from tools.bench_core import Row

TARGET_MS = 1_000
TICKET = {"title": "bench", "requester_id": "alice"}


def _callgate() -> list[str]:
    beside = Path(sys.executable).parent / "callgate"
    return [str(beside) if beside.exists() else (shutil.which("callgate") or "callgate")]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env["CALLGATE_DEV"] = "1"
    return env


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Prober:
    def __init__(self, gate: Gateway, token: str) -> None:
        self.answers: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._gate, self._token = gate, token
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            answer = self._gate.propose(session=self._token, tool="tickets.create", args=TICKET)
            self.answers.append((_now_ms(), str(answer["outcome"])))

    def first(self, since_ms: int, outcome: str, timeout_s: float = 30.0) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for at, seen in list(self.answers):
                if at >= since_ms and seen == outcome:
                    return at
            time.sleep(0.005)
        raise TimeoutError(f"no {outcome} answer within {timeout_s}s")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def bench_freeze(rounds: int) -> list[Row]:
    state = Path(tempfile.mkdtemp(prefix="callgate-bench-freeze-"))
    gate = connect(Settings(state_dir=state, dev=True))
    now = gate.app.clock()
    operator = gate.app.session_issuer.issue("olga", "ops", [OPERATOR_ROLE], now)
    alice = gate.app.session_issuer.issue("alice", "acme", ["support"], now)
    log = (state / "serve.log").open("w")
    serve = subprocess.Popen(
        [*_callgate(), "--state-dir", str(state), "serve"],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=_env(),
    )
    prober: _Prober | None = None
    from_event: list[int] = []
    from_command: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while "callgate serve" not in (state / "serve.log").read_text():
            if serve.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("callgate serve did not start")
            time.sleep(0.02)
        prober = _Prober(gate, alice)
        prober.first(0, "executed")
        for _ in range(rounds):
            for command, outcome in (("freeze", "frozen"), ("unfreeze", "executed")):
                started = _now_ms()
                argv = [*_callgate(), "--json", "--state-dir", str(state), command]
                argv += ["--tool", "tickets.create", "--reason", "bench", "--session", operator]
                done = subprocess.run(argv, capture_output=True, text=True, env=_env(), check=True)
                at = json.loads(done.stdout)["occurred_at"]
                seen = prober.first(at, outcome)
                from_event.append(seen - at)
                from_command.append(seen - started)
    finally:
        if prober is not None:
            prober.stop()
        gate.close()
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=30)
        log.close()
        shutil.rmtree(state, ignore_errors=True)
    worst = max(from_event)
    return [
        Row(
            "freeze: event → enforced (embedded serve)",
            f"median {statistics.median(from_event):.0f} ms, max {worst} ms",
            f"≤ {TARGET_MS} ms",
            worst <= TARGET_MS,
            f"{len(from_event)} freezes and unfreezes",
        ),
        Row(
            "freeze: command start → enforced",
            f"median {statistics.median(from_command):.0f} ms, max {max(from_command)} ms",
            "",
            None,
            "includes the command's process start-up",
        ),
    ]


def decided_at(gate: Gateway, invocation_id: str) -> int:
    """When the decider settled ``invocation_id`` (its status view's ``updated_at``)."""
    status = gate.backend.view("status", invocation_id)
    if status is None:
        raise RuntimeError(f"no status for {invocation_id}")
    return int(status["updated_at"])


def bench_freeze_kafka(rounds: int) -> list[Row]:
    """The same on Apache Kafka with two ``serve`` instances: a prober per partition, so
    "enforced" is the last partition's first refusal, whichever instance decides it."""
    from tests.kafka_support import (
        PARTITIONS,
        Deployment,
        KafkaServe,
        PartitionProber,
        cg,
        cli_ops,
        unique_prefix,
    )

    from tools.apache_kafka import ApacheKafka

    root = Path(tempfile.mkdtemp(prefix="callgate-bench-freeze-kafka-"))
    from_event: list[int] = []
    from_answer: list[int] = []
    from_command: list[int] = []
    try:
        with ApacheKafka() as broker:
            dep = Deployment(broker.bootstrap, unique_prefix("bench-freeze"), root / "state")
            serves = [KafkaServe(dep, root / f"{i}.log", instance_id=i) for i in ("a", "b")]
            probers: list[PartitionProber] = []
            try:
                for serve in serves:
                    serve.wait_ready()
                ops = cli_ops(dep)
                reader = dep.connect()
                probers = [PartitionProber(dep, p) for p in range(PARTITIONS)]
                for prober in probers:
                    prober.seen_after(0, "executed", timeout_s=60)
                for _ in range(rounds):
                    for command, outcome in (("freeze", "frozen"), ("unfreeze", "executed")):
                        started = _now_ms()
                        done = cg(dep, command, "--tool", "tickets.create", "--reason",
                                  "bench", "--session", ops)  # fmt: skip
                        at = int(done["occurred_at"])
                        firsts = [p.first(at, outcome) for p in probers]
                        answered = max(answer for _, answer, _ in firsts)
                        # The decision's own time (the status view's ``updated_at``, the
                        # decider's clock): enforcement without the answer's way back.
                        decided = max(decided_at(reader, inv) for _, _, inv in firsts)
                        from_event.append(decided - at)
                        from_answer.append(answered - at)
                        from_command.append(answered - started)
                reader.close()
            finally:
                for prober in probers:
                    prober.stop()
                for serve in serves:
                    serve.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    worst_ms = max(from_event)
    return [
        Row(
            "freeze: event → decided on every partition (Kafka, 2 serve instances)",
            f"median {statistics.median(from_event):.0f} ms, max {worst_ms} ms",
            f"≤ {TARGET_MS} ms",
            worst_ms <= TARGET_MS,
            f"{len(from_event)} freezes and unfreezes, {PARTITIONS} partitions",
        ),
        Row(
            "freeze: event → refusal answered on every partition (Kafka)",
            f"median {statistics.median(from_answer):.0f} ms, max {max(from_answer)} ms",
            "",
            None,
            "includes the probe call's round trip",
        ),
        Row(
            "freeze: command start → refusal answered on every partition (Kafka)",
            f"median {statistics.median(from_command):.0f} ms, max {max(from_command)} ms",
            "",
            None,
            "includes the command's process start-up",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", choices=["embedded", "kafka", "both"], default="both")
    ns = parser.parse_args()
    rows: list[Row] = []
    if ns.backend in ("embedded", "both"):
        rows += bench_freeze(ns.rounds)
    if ns.backend in ("kafka", "both"):
        rows += bench_freeze_kafka(ns.rounds)
    for row in rows:
        print(f"{row.measure}: {row.value} (target {row.target or '-'}; {row.note})")


if __name__ == "__main__":
    main()
