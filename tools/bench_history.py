"""``python -m tools bench --only history``: does a single call's cost grow with history?

Issue item "Reads that do not grow with history" (ADR 0016): a ``propose`` follows its own
request on its ``events`` partition from the offset recorded before publishing, so its
latency should not depend on how many invocations the log already holds. Measured on one
fresh Apache Kafka broker with the real pipeline (``callgate serve``'s supervisor):

1. ``samples`` proposals (``tickets.read``, one at a time, each waiting for its answer)
   on an empty log;
2. ``history`` settled invocations published (the bench mix: 70% reads, 20% low-impact
   mutations, 10% high-impact ones that stop at ``approval_required``) and waited for;
3. the same ``samples`` proposals again;
4. for comparison, what each call read before: the ``status`` view from the beginning.

The figures are p50 and max in milliseconds; ``--quick`` uses tiny counts.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.kafka.serve import create_topics
from callgate.adapters.kafka.topics import Topics
from callgate.bootstrap import Settings, bootstrap
from callgate.surfaces.sdk import Gateway
from tools.apache_kafka import ApacheKafka
from tools.bench_core import Row, mixed_proposals
from tools.bench_kafka import BENCH_BROKERS, Load, outbound, pipeline_processes, wait_idle

# Within this factor (plus a small allowance for a loaded machine) of the empty log.
GROWTH_FACTOR = 2.0
ALLOWANCE_MS = 25.0


def _timed_proposes(gate: Gateway, session: str, samples: int) -> list[float]:
    """Milliseconds per ``propose``, one call at a time (each waits for its answer)."""
    took: list[float] = []
    for i in range(samples):
        t0 = time.perf_counter()
        answer = gate.propose(session, "tickets.read", {"ticket_id": f"T-{i}"}, timeout_s=60)
        took.append((time.perf_counter() - t0) * 1000)
        if answer["outcome"] != "executed":
            raise RuntimeError(f"a timed propose did not execute: {answer}")
    return took


def _figure(took: list[float]) -> str:
    return f"{statistics.median(took):.1f} / {max(took):.1f} ms"


def bench_history(settings: Settings, history: int, samples: int) -> list[Row]:
    work = Path(tempfile.mkdtemp(prefix="callgate-bench-history-"))
    codec = AvroCodec.default()
    try:
        with ApacheKafka() as broker:
            app = bootstrap(
                Settings(
                    state_dir=work / "state",
                    backend="kafka",
                    topic_prefix=f"history-{uuid.uuid4().hex[:6]}",
                    bootstrap_servers=broker.bootstrap,
                    partitions=settings.partitions,
                    profile=settings.profile,
                    dev=True,  # the bench's sessions come from the development issuer
                )
            )
            names = [p.name for p in app.processes()]
            topics = Topics(app.settings.topic_prefix, settings.partitions)
            create_topics(app)
            kind = BENCH_BROKERS["apache"]  # the Kafka section's settings
            with pipeline_processes(app, kind):
                gate = Gateway(app, app.kafka_backend())
                alice = app.session_issuer.issue("alice", "acme", ["support"], app.clock())
                gate.propose(alice, "tickets.read", {"ticket_id": "T-0"}, timeout_s=120)  # joins
                wait_idle(broker.bootstrap, topics, names)
                empty = _timed_proposes(gate, alice, samples)
                load = Load(broker.bootstrap, topics, names, codec, kind)
                t0 = time.perf_counter()
                load.run(outbound(codec, mixed_proposals(app, history, seed=11)))
                filled_s = time.perf_counter() - t0
                wait_idle(broker.bootstrap, topics, names)
                full = _timed_proposes(gate, alice, samples)
                gate.close()
                before = app.kafka_backend()
                t0 = time.perf_counter()
                status_records = len(before.view_items_raw("status"))
                read_all_s = time.perf_counter() - t0
                before.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    empty_p50, full_p50 = statistics.median(empty), statistics.median(full)
    bound = GROWTH_FACTOR * empty_p50 + ALLOWANCE_MS
    return [
        Row(
            "history: propose on an empty log, p50 / max",
            _figure(empty),
            note=f"{samples} tickets.read proposals one at a time, real pipeline on Apache Kafka",
        ),
        Row(
            f"history: propose with {history:,} settled invocations, p50 / max",
            _figure(full),
            target=f"p50 ≤ {GROWTH_FACTOR:g} x empty + {ALLOWANCE_MS:g} ms",
            ok=full_p50 <= bound,
            note=f"the history took {filled_s:.1f} s to settle; the call reads its own "
            "partition from the offset recorded before publishing",
        ),
        Row(
            "history: status view read from the beginning",
            f"{read_all_s * 1000:.0f} ms",
            note=f"{status_records:,} records: what every call read before (for comparison)",
        ),
    ]
