"""``make fuzz``: a long, bounded campaign of hostile cases, with the figures printed.

    python -m tests.fuzz.run --seconds 600 [--kafka-seconds 60] [--proposals N]

The embedded backend takes the time budget (and stops earlier at ``--proposals``
proposals made, ``make fuzz-proposals``); with ``--kafka-seconds`` a smaller campaign
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
PROGRESS_S = 60.0


def campaign(
    gate: Gateway,
    seconds: float,
    settle_s: float,
    max_examples: int,
    max_proposals: int | None = None,
) -> Figures:
    """Feed generated cases to ``gate`` until ``seconds`` pass (or ``max_examples`` cases,
    or ``max_proposals`` proposals made), in
    chunks of ``CHUNK`` examples (each with a fresh random seed), so that the time budget
    ends the campaign without generating cases that would not run."""
    run = Campaign(gate, settle_s)
    deadline = time.monotonic() + seconds
    fed = 0

    started = time.monotonic()
    next_report = started + PROGRESS_S

    def more() -> bool:
        nonlocal next_report
        now = time.monotonic()
        if now >= next_report:  # the rate as the state grows
            next_report += PROGRESS_S
            print(f"  {now - started:.0f} s: {run.figures.proposals} proposals", flush=True)
        enough = max_proposals is not None and run.figures.proposals >= max_proposals
        return now < deadline and fed < max_examples and not enough

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
        if more():
            fed += 1
            run.feed(case)

    while more():
        one()
    run.watchdog()
    run.check_effects()
    return run.figures


def embedded(
    seconds: float, max_examples: int = 1_000_000, max_proposals: int | None = None
) -> Figures:
    with tempfile.TemporaryDirectory(prefix="callgate-fuzz-") as tmp:
        gate = connect(Settings(state_dir=Path(tmp) / "state", dev=True))
        try:
            return campaign(gate, seconds, 10.0, max_examples, max_proposals)
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
    parser.add_argument("--proposals", type=int, default=None, help="stop at this many")
    ns = parser.parse_args(argv)
    runs: list[tuple[str, Callable[[], Figures]]] = [
        ("embedded", lambda: embedded(ns.seconds, max_proposals=ns.proposals))
    ]
    if ns.kafka_seconds > 0:
        runs.append(("kafka (Apache Kafka)", lambda: on_kafka(ns.kafka_seconds)))
    ok = True
    for name, run in runs:
        started = time.monotonic()
        figures = run()
        elapsed = time.monotonic() - started
        rate = figures.proposals / elapsed if elapsed > 0 else 0.0
        print(f"== fuzz campaign on {name}: {elapsed:.0f} s, {rate:.1f} proposals/s")
        print(figures.report())
        for problem in figures.problems[:20]:
            print(f"  problem: {problem}")
        ok = ok and figures.ok()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
