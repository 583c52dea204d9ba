"""``make fuzz``: a long, bounded campaign of hostile cases, with the figures printed.

    python -m tests.fuzz.run --seconds 600 [--kafka-seconds 60] [--seed 1]

The embedded backend takes the time budget; with ``--kafka-seconds`` a smaller campaign
runs on a ``callgate serve`` over an Apache Kafka broker started for it. Exits 1 when any check
failed (a stall, an unauthorized effect, an overwrite, a code outside the vocabulary).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

from callgate.bootstrap import Settings
from callgate.surfaces.sdk import Gateway, connect
from tests.fuzz.drive import Campaign, Figures
from tests.fuzz.strategies import Case, cases

CHUNK = 50


def campaign(gate: Gateway, seconds: float, settle_s: float, max_examples: int) -> Figures:
    """Feed generated cases to ``gate`` until ``seconds`` pass (or ``max_examples``), in
    chunks of ``CHUNK`` examples (each with a fresh random seed), so that the time budget
    ends the campaign without generating cases that would not run."""
    run = Campaign(gate, settle_s)
    deadline = time.monotonic() + seconds
    fed = 0

    @settings(
        max_examples=CHUNK,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases())
    def one(case: Case) -> None:
        nonlocal fed
        if time.monotonic() < deadline and fed < max_examples:
            fed += 1
            run.feed(case)

    while time.monotonic() < deadline and fed < max_examples:
        one()
    run.watchdog()
    run.check_effects()
    return run.figures


def embedded(seconds: float, max_examples: int = 1_000_000) -> Figures:
    with tempfile.TemporaryDirectory(prefix="callgate-fuzz-") as tmp:
        gate = connect(Settings(state_dir=Path(tmp) / "state", dev=True))
        try:
            return campaign(gate, seconds, settle_s=10.0, max_examples=max_examples)
        finally:
            gate.close()


def on_kafka(seconds: float, max_examples: int = 100_000) -> Figures:
    from tools.apache_kafka import ApacheKafka

    from tests.kafka_support import Deployment, KafkaServe, unique_prefix

    with ApacheKafka() as broker, tempfile.TemporaryDirectory(prefix="callgate-fuzz-") as tmp:
        dep = Deployment(broker.bootstrap, unique_prefix("fuzz"), Path(tmp) / "state")
        server = KafkaServe(dep, Path(tmp) / "serve.log")
        try:
            server.wait_ready()
            gate = dep.connect()
            try:
                return campaign(gate, seconds, settle_s=30.0, max_examples=max_examples)
            finally:
                gate.close()
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=540.0)
    parser.add_argument("--kafka-seconds", type=float, default=0.0)
    ns = parser.parse_args(argv)
    runs: list[tuple[str, Callable[[], Figures]]] = [("embedded", lambda: embedded(ns.seconds))]
    if ns.kafka_seconds > 0:
        runs.append(("kafka (Apache Kafka)", lambda: on_kafka(ns.kafka_seconds)))
    ok = True
    for name, run in runs:
        started = time.monotonic()
        figures = run()
        print(f"== fuzz campaign on {name}: {time.monotonic() - started:.0f} s")
        print(figures.report())
        for problem in figures.problems[:20]:
            print(f"  problem: {problem}")
        ok = ok and figures.ok()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
