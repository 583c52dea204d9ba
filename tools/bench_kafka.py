"""The Kafka section of ``python -m tools bench``: ceiling, pipeline throughput, latency.

Every measurement runs on fresh topics on an Apache Kafka broker this module starts on
loopback (``_Brokers``: one broker, a new topic prefix each time), with the deployment's topic
layout and ``callgate serve``'s process layout: one OS process per
process, each a ``KafkaRunner`` with the same batch, transaction and consumer settings
(``BenchBroker.runner_args``). Method and figures: docs/explanation/benchmarks.md.

- **Recording.** Before anything is timed, the real processes run in-process over the
  proposals and every step is recorded: per process and input event, the key's state bytes
  after it and the outputs (``follow_up`` too). This measures the events, view records and
  state writes per proposal and hop.
- **Ceiling.** ``Replay`` processes, one per real process (same names, inputs, ``recovers``),
  look up the recorded step of each input and return it: byte-identical events, view records
  and state per hop, with no logic. Pipeline / ceiling is callgate's own cost. A single-hop
  transactional passthrough of 400-byte records is the broker's reference figure.
- **Final decision**: the first record of the ``status`` view topic for the invocation whose
  value says ``"settled":true`` (``callgate_projections.status``), as a ``read_committed``
  consumer in the bench process receives it. The replayed status records are the same bytes,
  so the ceiling ends at the same point.
- **Timed region.** Throughput: first publish of a burst to the last final decision.
  Latency: proposals published at a fixed rate; final decision minus *scheduled* publish
  time (no coordinated omission). Start-up, group joins and a probe happen before any timer.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import marshal
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from callgate.adapters.avro_codec import AvroCodec, MalformedEvent
from callgate.adapters.kafka.checkpoint import TRANSACTION_GAP_MS, ProducerFenced
from callgate.adapters.kafka.client import (
    FAST_GROUP_SETTINGS,
    client_config,
    fetched,
    headers_of,
    make_admin,
    make_producer,
    read_partitions_to_end,
)
from callgate.adapters.kafka.consumer import CONSUMER_LATENCY
from callgate.adapters.kafka.serve import Supervisor, create_topics, views_of
from callgate.adapters.kafka.topics import Topics, ensure_topics
from callgate.adapters.kafka.worker import batch_linger_ms, consumer_overrides
from callgate.adapters.view_codec import ViewCodec, ViewSchemaError
from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.codes import TERMINAL, Rejection
from callgate.domain.process_port import Output, Process, ViewRecord, reacts_to
from callgate.gc_settings import apply_gc_settings
from callgate_projections.status import outcome_for
from tools import child_env
from tools.bench_core import Row, mixed_proposals

BATCH_SIZE = 500  # ``callgate.adapters.kafka.worker`` defaults, passed explicitly to both
BATCH_TIMEOUT_MS = 20

# Offered loads (proposals/s) with a p99 target, publish -> status settled (issue
# "Performance"); the low one is measured in full runs only.
TARGET_RATE = 500
TARGET_P99_MS = 50.0
LOW_RATE = 50
LOW_P99_MS = 25.0
TARGET_RATIO = 0.7  # pipeline / ceiling
PLOT_FRACTIONS = (0.05, 0.15, 0.3, 0.5, 0.7, 0.9)  # of the measured pipeline throughput
HOP_RECORD_BYTES = 400
STALL_S = 60.0  # no final decision for this long: the rest did not settle
BROKERS = ("apache",)  # what ``--broker`` names


@dataclass(frozen=True)
class BenchBroker:
    """The broker the section runs on, and the consumer settings every runner of the
    pipeline and of the ceiling gets on it (on top of the runner's ``CONSUMER_LATENCY``):
    ``session.timeout.ms=6000`` and a 500 ms heartbeat, as ``callgate serve``'s test
    deployments use; otherwise the runner's own settings, as a production deployment has.
    """

    name: str
    consumer: Mapping[str, str]
    transaction_gap_ms: float = TRANSACTION_GAP_MS

    def runner_args(self) -> list[str]:
        args = ["--batch-size", str(BATCH_SIZE), "--batch-timeout-ms", str(BATCH_TIMEOUT_MS)]
        args += ["--transaction-gap-ms", f"{self.transaction_gap_ms:g}"]
        return args + [arg for k, v in self.consumer.items() for arg in ("-X", f"{k}={v}")]

    def fetch_wait_ms(self) -> str:
        return str(self.consumer.get("fetch.wait.max.ms", CONSUMER_LATENCY["fetch.wait.max.ms"]))


_GROUPS = {k: str(v) for k, v in FAST_GROUP_SETTINGS.items()}
BENCH_BROKERS = {"apache": BenchBroker("apache", dict(_GROUPS))}


def kafka_brokers(choice: str | None) -> tuple[list[str], str]:
    """The brokers ``--broker`` means (Apache Kafka, the reference broker) and a note."""
    return ["apache"], f"--broker {choice or 'apache'}"


class _Brokers:
    """Hands out a fresh place to measure in, per measurement: a new topic prefix on one
    Apache Kafka broker started for the section (one warm JVM, as in production), the
    phase's topics deleted after it."""

    def __init__(self, kind: BenchBroker) -> None:
        self.kind = kind
        self._shared: Any = None
        self._n = 0
        self.pid: int | None = None  # the broker of the current measurement

    def __enter__(self) -> _Brokers:
        from tools.apache_kafka import ApacheKafka

        self._shared = ApacheKafka().start()
        self.pid = self._shared.pid
        return self

    def __exit__(self, *exc: object) -> None:
        if self._shared is not None:
            self._shared.stop()

    @contextmanager
    def fresh(self, label: str = "bench") -> Iterator[tuple[str, str]]:
        """(bootstrap address, topic prefix) for one measurement."""
        self._n += 1
        prefix = f"{label}{self._n}"
        try:
            yield self._shared.bootstrap, prefix
        finally:
            _delete_topics(self._shared.bootstrap, prefix)


def _delete_topics(bootstrap: str, prefix: str) -> None:
    admin = make_admin(bootstrap, logger=client_logger())
    names = [t for t in admin.list_topics(timeout=30).topics if t.startswith(f"{prefix}.")]
    for future in admin.delete_topics(names, operation_timeout=30).values() if names else ():
        future.result()


# A recorded output: ("e", avro bytes) or ("v", view, key, value json or None, tenant).
Step = tuple[bytes | None, list[tuple[Any, ...]]]  # (state after, None: unchanged; outputs)


# --- recording and replay -------------------------------------------------------------------


class _Recorder:
    """Every step of one real process: handled[event_id] and follow[first emitted event_id]."""

    def __init__(self, proc: Process[Any], codec: AvroCodec, written: Counter[str]) -> None:
        self.proc, self.codec, self.written = proc, codec, written
        self.initial = proc.dump_state(proc.initial_state())
        self.states: dict[str, Any] = {}
        self.blobs: dict[str, bytes] = {}
        self.handled: dict[str, Step] = {}
        self.follow: dict[str, Step] = {}

    def step(
        self, table: dict[str, Step], cause: str, key: str, state: Any, outputs: Sequence[Output]
    ) -> list[ev.Event]:
        self.states[key] = state
        blob = self.proc.dump_state(state)
        changed = blob != self.blobs.get(key, self.initial)
        if changed:
            self.blobs[key] = blob
            self._count("changelog", len(blob))  # an upper bound: the runner writes per txn
        recorded: list[tuple[Any, ...]] = []
        emitted: list[ev.Event] = []
        for out in outputs:
            if isinstance(out, ViewRecord):
                recorded.append(("v", out.view, out.key, out.value_json, out.tenant))
                self._count(f"view.{out.view}", len(out.value_json or ""))
            else:
                data = self.codec.encode(out)
                recorded.append(("e", data))
                emitted.append(out)
                self._count(out.TOPIC, len(data))
        if changed or recorded:
            table[cause] = (blob if changed else None, recorded)
        return emitted

    def _count(self, kind: str, size: int) -> None:
        self.written[kind] += 1
        self.written[f"{kind} bytes"] += size

    def dump(self, path: Path) -> Path:
        p = self.proc
        data = {
            "name": p.name,
            "inputs": sorted(p.inputs),
            "recovers": p.recovers,
            # The runner consumes the other types undecoded: the ceiling must do as the
            # pipeline does (``KafkaRunner._handle_record``), no more and no less.
            "reacts_to": None
            if (kinds := reacts_to(p)) is None
            else sorted(k.__name__ for k in kinds),
            "initial": self.initial,
            "handled": self.handled,
            "follow": self.follow,
        }
        path.write_bytes(marshal.dumps(data))
        return path


def record(
    processes: Sequence[Process[Any]],
    inputs: Sequence[ev.Event],
    codec: AvroCodec,
    now_ms: int,
    out_dir: Path,
) -> tuple[dict[str, Path], Counter[str]]:
    """Run the real processes in-process over ``inputs``, recording every step.

    Events go FIFO to every process consuming their topic, as on Kafka; ``follow_up`` runs
    after each step that emitted events, while it emits. Returns a recording file per
    process and the counts (and ``<kind> bytes``) of what was written per kind of topic.
    """
    written: Counter[str] = Counter()
    recs = {p.name: _Recorder(p, codec, written) for p in processes}
    queue: deque[ev.Event] = deque(inputs)
    while queue:
        event = queue.popleft()
        key = event.partition_key
        for proc in processes:
            if event.TOPIC not in proc.inputs:
                continue
            rec = recs[proc.name]
            state = rec.states[key] if key in rec.states else proc.initial_state()
            state, outputs = proc.handle(state, event, now_ms)
            emitted = rec.step(rec.handled, event.event_id, key, state, outputs)
            while emitted:
                queue.extend(emitted)
                state, outputs = proc.follow_up(rec.states[key], emitted, now_ms)
                emitted = rec.step(rec.follow, emitted[0].event_id, key, state, outputs)
    files = {name: rec.dump(out_dir / f"{name}.replay") for name, rec in recs.items()}
    return files, written


class Replay:
    """A ``Process[bytes]`` with no logic: the recorded state and outputs of each input.

    Its state is the real process's state bytes, so the runner writes the same changelog
    records as for the real process; inputs it has no record of change nothing.
    """

    def __init__(self, data: Mapping[str, Any], codec: AvroCodec) -> None:
        self.name: str = data["name"]
        self.inputs: frozenset[str] = frozenset(data["inputs"])
        self.recovers: bool = data["recovers"]
        names = data.get("reacts_to")
        self.reacts_to: frozenset[type[ev.Event]] | None = (
            None if names is None else frozenset(ev.BY_NAME[n] for n in names)
        )
        self._initial: bytes = data["initial"]
        self._handled = {k: _decode(s, codec) for k, s in data["handled"].items()}
        self._follow = {k: _decode(s, codec) for k, s in data["follow"].items()}

    def initial_state(self) -> bytes:
        return self._initial

    def handle(self, state: bytes, event: ev.Event, now_ms: int) -> tuple[bytes, Sequence[Output]]:
        found = self._handled.get(event.event_id)
        if found is None:
            return state, ()
        return found[0] or state, found[1]

    def follow_up(
        self, state: bytes, committed: Sequence[ev.Event], now_ms: int
    ) -> tuple[bytes, Sequence[Output]]:
        outputs: list[Output] = []
        for event in committed:
            if (found := self._follow.get(event.event_id)) is not None:
                state = found[0] or state
                outputs += found[1]
        return state, outputs

    def due(self, state: bytes, now_ms: int) -> tuple[bytes, Sequence[Output]]:
        return state, ()

    def next_due(self, state: bytes) -> int | None:
        return None

    def recover(self, state: bytes, now_ms: int) -> tuple[bytes, Sequence[Output]]:
        return state, ()

    def dump_state(self, state: bytes) -> bytes:
        return state

    def load_state(self, data: bytes) -> bytes:
        return data


def _decode(step: Step, codec: AvroCodec) -> tuple[bytes | None, tuple[Output, ...]]:
    outs = [codec.decode(o[1]) if o[0] == "e" else ViewRecord(*o[1:]) for o in step[1]]
    return step[0], tuple(outs)


def replay_worker(argv: Sequence[str] | None = None) -> int:
    """``python -m tools.bench_kafka RECORDING ...``: one ``Replay`` under a
    ``KafkaRunner``, built as ``callgate.adapters.kafka.worker`` builds a real process."""
    parser = argparse.ArgumentParser(description="Run one replay process (callgate bench).")
    parser.add_argument("recording", type=Path)
    for name in ("--bootstrap-servers", "--prefix", "--state-dir"):
        parser.add_argument(name, required=True)
    for name in ("--partitions", "--batch-size", "--batch-timeout-ms"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--transaction-gap-ms", type=float, default=TRANSACTION_GAP_MS)
    parser.add_argument("-X", dest="consumer", action="append", default=[], metavar="KEY=VALUE")
    ns = parser.parse_args(argv)
    apply_gc_settings()  # as the real worker's
    codec = AvroCodec.default()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    process = Replay(marshal.loads(ns.recording.read_bytes()), codec)
    settings = Settings(
        state_dir=Path(ns.state_dir),
        bootstrap_servers=ns.bootstrap_servers,
        topic_prefix=ns.prefix,
        partitions=ns.partitions,
        instance_id="0",
    )
    runner = bootstrap(settings).kafka_runner(
        process,
        batch_size=ns.batch_size,
        batch_timeout_ms=ns.batch_timeout_ms,
        consumer_overrides=consumer_overrides(ns.consumer),
        transaction_gap_ms=ns.transaction_gap_ms,
        batch_linger_ms=batch_linger_ms(process.name),  # as the real worker's
    )
    try:
        runner.run(stop)
    except ProducerFenced:
        return 3
    return 0


# --- client logs ------------------------------------------------------------------------------


class ClientLog(logging.Handler):
    """Keeps the log lines of the bench's own Kafka clients off stderr: librdkafka writes
    there unless it is given a logger (e.g. "Connect ... failed" from a client whose broker
    the bench has just stopped). They are counted, and the last few kept for the report."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0
        self.last: deque[str] = deque(maxlen=3)

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        self.last.append(record.getMessage()[:160])


CLIENT_LOGGER = "tools.bench.kafka_clients"


def client_logger() -> logging.Logger:
    """The logger handed to every Kafka client the bench creates (``"logger"`` setting)."""
    return logging.getLogger(CLIENT_LOGGER)


@contextmanager
def captured_client_logs() -> Iterator[ClientLog]:
    """Route the bench's client logs to a ``ClientLog`` for the duration of the section."""
    logger = client_logger()
    handler = ClientLog()
    logger.addHandler(handler)
    logger.propagate = False  # not to the root logger (nor to ``logging.lastResort``)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


# --- publishing and reading final decisions -------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outbound:
    """A proposal ready to publish (encoded before any timer starts)."""

    invocation_id: bytes
    key: bytes
    value: bytes


def _reader(bootstrap: str, fetch_wait_ms: str) -> Consumer:
    """The bench's ``read_committed`` consumer (``assign()`` only: never joins or commits).
    ``fetch_wait_ms`` bounds how late an empty fetch returns."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tools.bench",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": fetch_wait_ms,
            "logger": client_logger(),
        }
    )


def outbound(codec: AvroCodec, proposals: Sequence[ev.Event]) -> list[Outbound]:
    return [
        Outbound(p.invocation_id.encode(), p.partition_key.encode(), codec.encode(p))
        for p in proposals
    ]


@dataclass(frozen=True, slots=True)
class Result:
    seconds: float  # first (scheduled) publish to the last final decision
    latencies_ms: list[float]  # sorted, of the proposals that settled
    # invocation id -> why it did not settle (its last status record, or none): a proposal
    # that never settles is a defect, reported instead of failing the whole section.
    unsettled: dict[str, str] = field(default_factory=dict)
    # Sorted: scheduled publish -> the outcome event on the ``events`` log (what a caller
    # reading its own invocation from the log waits for: one transaction and one hand-off
    # fewer than the status view).
    outcome_ms: list[float] = field(default_factory=list)
    # Per hop of the critical path (``HOPS``), sorted ms, of the executed proposals.
    hops: dict[str, list[float]] = field(default_factory=dict)
    # Cores the broker process used on average while the timed load ran (None: unknown).
    broker_cores: float | None = None

    def rate(self) -> float:
        return len(self.latencies_ms) / self.seconds if self.seconds > 0 else 0.0

    def pct(self, q: float, outcome: bool = False) -> float:
        xs = self.outcome_ms if outcome else self.latencies_ms
        if not xs:
            return float("nan")
        return xs[min(len(xs) - 1, max(0, round(q * len(xs)) - 1))]

    def pcts(self, outcome: bool = False) -> str:
        return " / ".join(f"{self.pct(q, outcome):.1f}" for q in (0.5, 0.95, 0.99)) + " ms"

    def settled_note(self) -> str:
        """``all settled``, or how many did not and their last status records."""
        if not self.unsettled:
            return "all settled"
        total = len(self.latencies_ms) + len(self.unsettled)
        return (
            f"{len(self.unsettled):,} of {total:,} did not settle within {STALL_S:g} s of "
            f"the last decision ({unsettled_reasons(self.unsettled)})"
        )


def unsettled_reasons(unsettled: Mapping[str, str]) -> str:
    """The reasons of unsettled proposals, counted, most frequent first."""
    return ", ".join(f"{n} x {why}" for why, n in Counter(unsettled.values()).most_common())


def _stuck_at(status: bytes | None) -> str:
    """Where a proposal stopped, from its last status record (``callgate_projections.status``)."""
    if status is None:
        return "no status record: not past the invocations process's transaction"
    try:
        value = ViewCodec.default().decode(status)[1]  # Avro (ADR 0016)
    except ViewSchemaError:
        return "unreadable status record"
    return f"last status {value.get('outcome')!r}, settled={value.get('settled')}"


# The critical path of an executed proposal (docs/explanation/benchmarks.md, "Analysis"), cut
# at the events the bench sees on the ``events`` log by their record timestamps (the
# producer's create time, in ms, when the process produced it inside its transaction) and
# at the bench's receipt of the settled status record. What each span holds:
HOPS = (
    ("publish → PolicyDecided", "produce ack, hand-off H1, the invocations process's handle"),
    ("→ ExecutionStarted", "the same handle: one transaction T1 holds both (ADR 0077)"),
    ("→ ExecutionSucceeded", "the commit of T1, the provider call"),
    ("→ status produced", "the commit of T2, hand-off H2, the status projection"),
    ("→ status received", "the status projection's commit T3, hand-off H3 to the caller"),
)
_HOP_EVENTS = ("PolicyDecided", "ExecutionStarted", "ExecutionSucceeded")


def _hop_spans(
    scheduled_ms: float, stamps: Mapping[str, float], status_ms: float, received_ms: float
) -> list[float] | None:
    """The spans of ``HOPS`` for one proposal (wall-clock ms), or None where it did not
    take the executed path (an approval, a denial)."""
    if any(name not in stamps for name in _HOP_EVENTS):
        return None
    points = [scheduled_ms, *(stamps[n] for n in _HOP_EVENTS), status_ms, received_ms]
    return [b - a for a, b in itertools.pairwise(points)]


class Load:
    """Publishes proposals and waits for their final decisions on the ``status`` view; on
    the way it notes when each one's outcome event reached the ``events`` log, and the
    record timestamps of the events on its critical path (``HOPS``)."""

    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        names: Sequence[str],
        codec: AvroCodec,
        kind: BenchBroker,
        broker_pid: int | None = None,
    ) -> None:
        self.bootstrap, self.topics, self.names, self.codec = bootstrap, topics, names, codec
        self.broker_pid = broker_pid
        self.requests = topics.physical("requests")
        no_linger: dict[str, Any] = {"linger.ms": 0}  # a platform sends each call at once
        no_linger["logger"] = client_logger()
        self.producer: Producer = make_producer(bootstrap, None, **no_linger)
        self.reader = _reader(bootstrap, kind.fetch_wait_ms())
        self.views = ViewCodec.default()  # status values are Avro (ADR 0016)
        self.events = topics.physical("events")
        self.reader.assign(
            [
                TopicPartition(t, p, 0)
                for t in (topics.view("status"), self.events)
                for p in range(topics.partitions)
            ]
        )

    def _event(self, value: bytes) -> tuple[ev.Event | None, bool]:
        """The event ``value`` holds (None: not one), and whether it is its invocation's
        final outcome event (``outcome_for`` in ``codes.TERMINAL``, as the status view
        reads it)."""
        try:
            event = self.codec.decode(value)
        except MalformedEvent:
            return None, False
        try:
            code = outcome_for(event)
        except Rejection:
            return event, False
        return event, code in TERMINAL

    def run(
        self, items: Sequence[Outbound], rate: float | None = None, idle: bool = True
    ) -> Result:
        """Publish ``items`` (at once, or ``rate`` per second) until each is decided; first,
        untimed, wait until the processes are idle (``wait_idle``) unless ``idle`` is False."""
        if idle:
            wait_idle(self.bootstrap, self.topics, self.names)
        n, sent = len(items), 0
        scheduled: dict[bytes, float] = {}
        latencies: list[float] = []
        seen: dict[bytes, bytes] = {}  # the last unsettled status record per invocation
        outcomes: list[float] = []
        waiting: dict[bytes, float] = {}  # scheduled publish of those without an outcome
        stamps: dict[bytes, dict[str, float]] = {}  # record timestamps on the critical path
        spans: list[list[float]] = []
        t0 = last = time.perf_counter()
        wall0 = time.time() * 1000 - t0 * 1000  # perf_counter seconds -> wall-clock ms
        broker0 = _process_cpu(self.broker_pid)
        while len(latencies) < n:
            now = time.perf_counter()
            while sent < n and (rate is None or t0 + sent / rate <= now):
                scheduled[items[sent].invocation_id] = now if rate is None else t0 + sent / rate
                waiting[items[sent].invocation_id] = scheduled[items[sent].invocation_id]
                self._produce(items[sent])
                sent += 1
            self.producer.poll(0)
            wait = 0.05 if rate is None or sent == n else t0 + sent / rate - now
            for msg in fetched(self.reader, max(0.0, min(wait, 0.05))):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                value, key = msg.value() or b"", msg.key() or b""
                if msg.topic() == self.events:
                    event, final = self._event(value)
                    if event is None:
                        continue
                    invocation = event.invocation_id.encode()
                    if invocation in scheduled and event.event_type in _HOP_EVENTS:
                        stamps.setdefault(invocation, {}).setdefault(
                            event.event_type, float(msg.timestamp()[1])
                        )
                    if final and invocation in waiting:
                        outcomes.append((time.perf_counter() - waiting.pop(invocation)) * 1000)
                    continue
                if key not in scheduled:
                    continue
                if value and self.views.decode(value)[1]["settled"] is True:
                    last = time.perf_counter()
                    publish = scheduled.pop(key)
                    latencies.append((last - publish) * 1000)
                    seen.pop(key, None)
                    span = _hop_spans(
                        wall0 + publish * 1000,
                        stamps.pop(key, {}),
                        float(msg.timestamp()[1]),
                        wall0 + last * 1000,
                    )
                    if span is not None:
                        spans.append(span)
                else:
                    seen[key] = value
            if time.perf_counter() - max(last, t0 + sent / (rate or 1e9)) > STALL_S:
                break  # the rest did not settle: reported with where each one stopped
        unsettled = {k.decode(): _stuck_at(seen.get(k)) for k in scheduled}
        unsettled.update({i.invocation_id.decode(): "never published" for i in items[sent:]})
        hops = {name: sorted(s[i] for s in spans) for i, (name, _) in enumerate(HOPS)}
        broker1, wall = _process_cpu(self.broker_pid), time.perf_counter() - t0
        cores = None
        if broker0 is not None and broker1 is not None and wall > 0:
            cores = (broker1 - broker0) / wall
        return Result(last - t0, sorted(latencies), unsettled, sorted(outcomes), hops, cores)

    def _produce(self, item: Outbound) -> None:
        while True:
            try:
                self.producer.produce(self.requests, key=item.key, value=item.value)
                return
            except BufferError:
                self.producer.poll(0.01)

    def close(self) -> None:
        self.reader.close()
        self.producer.flush(10)


def wait_idle(
    bootstrap: str,
    topics: Topics,
    names: Sequence[str],
    quiet_s: float = 2.0,
    timeout_s: float = 300,
) -> None:
    """Untimed, before each run: every process has joined and handled input (its group has
    committed an input position), and no group's committed positions moved for ``quiet_s``.
    So a run never overlaps the backlog of the one before, not even in the projections that
    do not gate the final decision."""
    inputs = [topics.physical(t) for t in ("requests", "events")]
    want = [TopicPartition(t, p) for t in inputs for p in range(topics.partitions)]
    groups = [
        Consumer(
            client_config(bootstrap, **{"group.id": topics.group(n), "logger": client_logger()})
        )
        for n in names
    ]
    try:
        start = since = time.monotonic()
        last: list[list[int]] = []
        while True:
            now = [[tp.offset for tp in g.committed(want, timeout=10)] for g in groups]
            if now != last:
                last, since = now, time.monotonic()
            elif all(max(o) > 0 for o in now) and time.monotonic() - since >= quiet_s:
                return
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"the processes did not settle within {timeout_s:g} s")
            time.sleep(0.1)
    finally:
        for group in groups:
            group.close()


# --- processes --------------------------------------------------------------------------------


@contextmanager
def replay_processes(
    files: Sequence[Path], bootstrap: str, topics: Topics, state_dir: Path, kind: BenchBroker
) -> Iterator[None]:
    """One OS process per recording, as ``callgate serve`` runs one per real process."""
    args = [
        "--bootstrap-servers",
        bootstrap,
        "--prefix",
        topics.prefix,
        "--partitions",
        str(topics.partitions),
        "--state-dir",
        str(state_dir),
        *kind.runner_args(),
    ]
    module = [sys.executable, "-m", "tools.bench_kafka"]
    children = [subprocess.Popen([*module, str(f), *args], env=child_env()) for f in files]
    try:
        yield
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


@contextmanager
def pipeline_processes(app: App, kind: BenchBroker) -> Iterator[None]:
    """``callgate serve``'s supervisor: one ``callgate.adapters.kafka.worker`` per process."""
    sup = Supervisor(app, [p.name for p in app.processes()], kind.runner_args())
    sup.start()
    try:
        yield
    finally:
        sup.stop()


# --- the single-hop reference -----------------------------------------------------------------


def _padded(make: Callable[[str], ev.Event], size: int, codec: AvroCodec) -> int:
    """The padding length that makes ``make(padding)`` encode to ``size`` bytes."""
    for pad in range(size):
        if len(codec.encode(make("x" * pad))) == size:
            return pad
    raise ValueError(f"no padding gives {size} bytes")


def single_hop(
    bootstrap: str,
    prefix: str,
    work: Path,
    partitions: int,
    n: int,
    codec: AvroCodec,
    kind: BenchBroker,
) -> Row:
    """Records/s through one transactional passthrough hop without state, 400-byte records:
    the broker's reference."""

    def proposal(i: int, pad: str) -> ev.Event:
        return ev.ToolCallProposed(
            event_id=f"in-{i:08d}",
            invocation_id=f"hop-{i:08d}",
            partition_key=f"hop-{i:08d}",
            session_token="",
            tool="tickets.read",
            args_json=pad,
        )

    def output(i: int, pad: str) -> ev.Event:
        return ev.ExecutionSucceeded(
            event_id=f"out-{i:08d}",
            invocation_id=f"hop-{i:08d}",
            partition_key=f"hop-{i:08d}",
            execution_token="",
            result_json=pad,
        )

    in_pad = "x" * _padded(lambda pad: proposal(0, pad), HOP_RECORD_BYTES, codec)
    out_pad = "x" * _padded(lambda pad: output(0, pad), HOP_RECORD_BYTES, codec)
    topics = Topics(prefix, partitions)
    requests, events = topics.physical("requests"), topics.physical("events")
    data = {
        "name": "passthrough",
        "inputs": ["requests"],
        "recovers": False,
        "initial": b"",
        "handled": {
            f"in-{i:08d}": (None, [("e", codec.encode(output(i, out_pad)))]) for i in range(n)
        },
        "follow": {},
    }
    (work / "passthrough.replay").write_bytes(marshal.dumps(data))
    admin = make_admin(bootstrap, logger=client_logger())
    ensure_topics(admin, topics.specs([Replay({**data, "handled": {}}, codec)]))
    producer = make_producer(bootstrap, logger=client_logger())
    for i in range(n):
        producer.produce(
            requests, key=f"hop-{i:08d}".encode(), value=codec.encode(proposal(i, in_pad))
        )
        producer.poll(0)
    producer.flush(60)
    del producer, admin  # destroyed now, not after the broker stopped
    # The backlog is published before the runner starts, and the clock runs from its first
    # committed transaction to its last: start-up and the group join are not timed.
    reader = _reader(bootstrap, kind.fetch_wait_ms())
    reader.assign([TopicPartition(events, p, 0) for p in range(partitions)])
    seen: set[bytes] = set()
    first: bytes | None = None
    in_first, t_first, t_last = 0, 0.0, time.perf_counter()
    with replay_processes([work / "passthrough.replay"], bootstrap, topics, work / "hop", kind):
        while len(seen) < n:
            if time.perf_counter() - t_last > STALL_S:
                raise TimeoutError(f"{n - len(seen)} of {n} passthrough records never arrived")
            for msg in fetched(reader, 1.0):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                if (key := msg.key() or b"") in seen:
                    continue  # a copy of an event already seen (guard)
                seen.add(key)
                token = dict(headers_of(msg)).get("cg-txn")
                if first is None:
                    first, t_first = token, time.perf_counter()
                in_first += token == first
                t_last = time.perf_counter()
    reader.close()
    if in_first == n:
        raise ValueError(f"{n} records fit in one transaction: nothing to time")
    rate = (n - in_first) / (t_last - t_first)
    return Row(
        "kafka ceiling, reference: single-hop transactional passthrough",
        f"{rate:,.0f} records/s",
        "",
        None,
        f"{n:,} records of {HOP_RECORD_BYTES} B, transactions of ≤ {BATCH_SIZE}, "
        "1 OS process, no state; from its first commit to its last",
    )


# --- the section ------------------------------------------------------------------------------


def bench_kafka(
    settings: Settings,
    proposals: int,
    latency_s: float,
    plot: Path | None = None,
    broker: str | None = None,
) -> list[Row]:
    """Ceiling, pipeline throughput and latency on brokers of the bench's own (module
    docstring), per broker ``kafka_brokers(broker)`` names; each broker's rows say which.

    ``settings`` gives the partition count and profile; brokers, topics and state are the
    bench's own (a temporary directory). The latency plot (every broker measured, side by
    side) goes to ``plot`` (default ``<state_dir>/latency.png``). The bench's own Kafka
    clients log to a ``ClientLog``, never to stderr; each broker's last row counts them.
    A broker whose run fails gets a ``FAILED`` row; the others still report.
    """
    kinds, why = kafka_brokers(broker)
    path = plot or settings.state_dir / "latency.png"
    rows = [Row("kafka brokers", ", ".join(kinds), "", None, why)]
    measured: dict[str, _Figures] = {}
    per_broker: dict[str, list[Row]] = {}
    for name in kinds:
        before = _cpu_seconds()
        work = Path(tempfile.mkdtemp(prefix="callgate-bench-kafka-"))
        with captured_client_logs() as client_log:
            try:
                found, fig = _run(settings, work, proposals, latency_s, BENCH_BROKERS[name])
                measured[name] = fig
                per_broker[name] = found
            except Exception as e:  # reported, and the next broker still runs
                per_broker[name] = [Row("kafka: FAILED", f"{type(e).__name__}: {e}", ok=False)]
            finally:
                shutil.rmtree(work, ignore_errors=True)
        per_broker[name].append(_noise(before, _cpu_seconds(), client_log))
    shown_plot = _plot(measured, path) if measured else "no plot: no broker was measured"
    for name in kinds:
        tail = _plot_row(measured[name], shown_plot) if name in measured else []
        rows += _labelled([*per_broker[name][:-1], *tail, per_broker[name][-1]], name)
    return rows


def _labelled(rows: Sequence[Row], broker: str) -> list[Row]:
    """``kafka ...`` rows as ``kafka (<broker>) ...``."""
    return [
        Row(f"kafka ({broker}){_space(r.measure.removeprefix('kafka'))}", *_rest(r)) for r in rows
    ]


def _space(rest: str) -> str:
    return rest if rest.startswith(":") else " " + rest.lstrip(" ")


def _rest(row: Row) -> tuple[str, str, bool | None, str]:
    return row.value, row.target, row.ok, row.note


def _cpu_seconds() -> tuple[float, float, float]:
    """(wall, CPU seconds the whole machine was busy, CPU seconds of this process tree:
    itself, its reaped children and its live ones, such as an Apache Kafka broker that
    lives for the whole section)."""
    own = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    mine = sum(r.ru_utime + r.ru_stime for r in own) + _live_children_cpu()
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # not idle/iowait
    except (OSError, ValueError):
        busy = float("nan")
    return time.monotonic(), busy, mine


def _process_cpu(pid: int | None) -> float | None:
    """CPU seconds process ``pid`` has used, all its threads (None: no such process here)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _live_children_cpu() -> float:
    """CPU seconds of this process's live children (``/proc/<pid>/stat``; 0 elsewhere)."""
    total, me, tick = 0, str(os.getpid()), os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == me:  # ppid; then utime, stime at 14 and 15 of the whole line
            total += int(fields[11]) + int(fields[12])
    return total / tick


def _others(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """Cores other processes used on average between ``before`` and ``after``."""
    wall = after[0] - before[0]
    return max(0.0, (after[1] - before[1]) - (after[2] - before[2])) / wall if wall else 0.0


def _noise(
    before: tuple[float, float, float], after: tuple[float, float, float], client_log: ClientLog
) -> Row:
    """How much CPU other processes took while the section ran (its children are reaped
    when it ends, so their CPU is in RUSAGE_CHILDREN)."""
    wall = after[0] - before[0]
    others = _others(before, after)
    logs = f"; the bench's Kafka clients logged {client_log.count} line(s), kept off stderr"
    if client_log.last:
        logs += " (last: " + " | ".join(client_log.last) + ")"
    return Row(
        "kafka: CPU used by other processes during the section",
        f"{others:.2f} of {os.cpu_count()} cores",
        "",
        None,
        f"machine busy time minus this bench's processes, averaged over {wall:,.0f} s: "
        "figures shrink as it grows" + logs,
    )


@dataclass
class _Figures:
    written: Counter[str] = field(default_factory=Counter)  # recorded from the real processes
    recorded: int = 0  # proposals recorded
    recorded_s: float = 0.0
    ceiling: Result | None = None
    # The same, of the three-process layout before ADR 0077 (decider and executor apart).
    earlier_ceiling: Result | None = None
    earlier_latency: dict[int, Result] = field(default_factory=dict)  # its ceiling's
    pipeline: Result | None = None
    latency: dict[int, Result] = field(default_factory=dict)  # offered rate -> pipeline
    ceiling_latency: dict[int, Result] = field(default_factory=dict)
    actual: Counter[str] = field(default_factory=Counter)  # read back from the pipeline
    others: dict[int, float] = field(default_factory=dict)  # offered rate -> others' cores
    published: int = 0


def _run(
    settings: Settings, work: Path, n: int, latency_s: float, kind: BenchBroker
) -> tuple[list[Row], _Figures]:
    with _Brokers(kind) as brokers:
        return _measure(settings, work, n, latency_s, brokers)


def _measure(
    settings: Settings, work: Path, n: int, latency_s: float, brokers: _Brokers
) -> tuple[list[Row], _Figures]:
    codec = AvroCodec.default()
    # The owner holds the keys; its development-issuer sessions drive the load.
    owner = bootstrap(Settings(state_dir=work / "owner", profile=settings.profile, dev=True))
    probe = mixed_proposals(owner, 10, seed=2)
    mix = mixed_proposals(owner, n, seed=1)
    fig = _Figures()
    with brokers.fresh("bench-hop") as (address, prefix):
        hops = max(5_000, 10 * n)
        rows = [single_hop(address, prefix, work, settings.partitions, hops, codec, brokers.kind)]

    def phase(replays: Mapping[str, Path] | None, earlier: bool = False) -> Any:
        return _phase(settings, work, codec, probe, replays, brokers, earlier)

    with phase(None) as load:
        fig.pipeline = load.run(outbound(codec, mix))
        fig.actual = _written(load.bootstrap, load.topics, views_of(owner))
        fig.published = len(probe) + n
    # Offered loads: the target, and (not with --quick) shares of the measured throughput.
    paced = {TARGET_RATE: mixed_proposals(owner, int(TARGET_RATE * latency_s), seed=3)}
    if latency_s >= 5:
        paced[LOW_RATE] = mixed_proposals(owner, int(LOW_RATE * latency_s), seed=4)
    for i, share in enumerate(PLOT_FRACTIONS if latency_s >= 5 else ()):
        rate = int(max(10, round(fig.pipeline.rate() * share, -1)))
        paced.setdefault(rate, mixed_proposals(owner, int(rate * latency_s / 2), seed=10 + i))
    # The real processes, recorded with their own state dir and effect ledger, same keys.
    shutil.copytree(work / "owner" / "keys", work / "recording" / "keys")
    rec_app = bootstrap(Settings(state_dir=work / "recording", profile=settings.profile, dev=True))
    inputs = [*probe, *mix, *(p for batch in paced.values() for p in batch)]
    t0 = time.perf_counter()
    files, fig.written = record(rec_app.processes(), inputs, codec, rec_app.clock(), work)
    fig.recorded, fig.recorded_s = len(inputs), time.perf_counter() - t0
    # The earlier layout's ceiling, recorded apart (its own ledger) over the same inputs.
    shutil.copytree(work / "owner" / "keys", work / "earlier" / "keys")
    old = bootstrap(Settings(state_dir=work / "earlier", profile=settings.profile, dev=True))
    old_files, _ = record(_earlier(old), inputs, codec, old.clock(), work / "earlier")

    with phase(files) as load:
        fig.ceiling = load.run(outbound(codec, mix))
    with phase(old_files, earlier=True) as load:
        fig.earlier_ceiling = load.run(outbound(codec, mix))
    for rate, batch in sorted(paced.items()):  # alternating, so noise hits both alike
        before = _cpu_seconds()
        with phase(files) as load:
            fig.ceiling_latency[rate] = load.run(outbound(codec, batch), rate)
        if rate in (LOW_RATE, TARGET_RATE):
            with phase(old_files, earlier=True) as load:
                fig.earlier_latency[rate] = load.run(outbound(codec, batch), rate)
        with phase(None) as load:
            fig.latency[rate] = load.run(outbound(codec, batch), rate)
        fig.others[rate] = _others(before, _cpu_seconds())
    return rows + _rows(fig, n, latency_s), fig


@contextmanager
def _phase(
    settings: Settings,
    work: Path,
    codec: AvroCodec,
    probe: Sequence[ev.Event],
    replays: Mapping[str, Path] | None,
    brokers: _Brokers,
    earlier: bool = False,
) -> Iterator[Load]:
    """Fresh topics and processes (the real ones, or ``replays``) on a fresh broker or
    prefix (``_Brokers.fresh``), joined and past the probe, untimed."""
    state = Path(tempfile.mkdtemp(prefix="phase-", dir=work))
    shutil.copytree(work / "owner" / "keys", state / "keys")
    kind = brokers.kind
    with brokers.fresh() as (address, prefix):
        app = bootstrap(
            Settings(
                state_dir=state,
                backend="kafka",
                topic_prefix=prefix,
                bootstrap_servers=address,
                partitions=settings.partitions,
                profile=settings.profile,
                dev=True,
            )
        )
        layout = _earlier(app) if earlier else app.processes()
        names = [p.name for p in layout]
        topics = Topics(app.settings.topic_prefix, settings.partitions)
        if earlier:  # its own changelogs
            ensure_topics(make_admin(address), topics.specs(layout, views_of(app)))
        else:
            create_topics(app)
        processes = (
            pipeline_processes(app, kind)
            if replays is None
            else replay_processes([replays[p] for p in names], address, topics, state, kind)
        )
        with processes:
            load = Load(address, topics, names, codec, kind, brokers.pid)
            try:
                load.run(outbound(codec, probe), idle=False)  # waits for the group joins
                yield load
            finally:
                load.close()


def _earlier(app: App) -> list[Process[Any]]:
    """The three-process layout before ADR 0077: the decider and the executor apart."""
    return [app.decider(), app.executor(), *app.projections()]


def _written(bootstrap_servers: str, topics: Topics, views: Mapping[str, str]) -> Counter[str]:
    """What the pipeline wrote to ``events`` and its view topics (read back after the runs)."""
    found: Counter[str] = Counter()
    kinds = {topics.physical("events"): "events"} | {topics.view(v): f"view.{v}" for v in views}
    for topic, kind in kinds.items():
        seen: set[tuple[int, bytes | None, bytes | None]] = set()
        for rec in read_partitions_to_end(bootstrap_servers, topic, timeout_s=120):
            if (rec.partition, rec.key, rec.value) in seen:
                continue  # an aborted transaction's leftover repeats a committed record
            seen.add((rec.partition, rec.key, rec.value))
            found[kind] += 1
            found[f"{kind} bytes"] += len(rec.value or b"")
    return found


def _per(counts: Mapping[str, int], proposals: int) -> str:
    kinds = ["events", *sorted(k for k in counts if k.startswith("view.") and "bytes" not in k)]
    return "; ".join(
        f"{k} {counts[k] / proposals:.2f} x {counts[f'{k} bytes'] / counts[k]:,.0f} B"
        for k in kinds
        if counts.get(k)
    )


def _rows(fig: _Figures, n: int, latency_s: float) -> list[Row]:
    assert fig.ceiling and fig.pipeline and fig.earlier_ceiling
    ratio = fig.pipeline.rate() / fig.ceiling.rate() if fig.ceiling.rate() else float("nan")
    old = fig.earlier_ceiling
    old_ratio = fig.pipeline.rate() / old.rate() if old.rate() else float("nan")
    changelog = fig.written["changelog"]
    state = f"{changelog / fig.recorded:.2f} x {fig.written['changelog bytes'] / changelog:,.0f} B"
    same = "publish → status settled; same broker, topics, partitions, records, transactions"
    return [
        Row(
            "kafka topology per proposal (recorded from the real processes)",
            _per(fig.written, fig.recorded),
            "",
            None,
            f"state writes ≤ {state}; every process reads every event, the invocations "
            f"process also the proposal; {fig.recorded:,} proposals recorded in "
            f"{fig.recorded_s:.1f} s",
        ),
        Row(
            "kafka ceiling: same topology, no logic",
            f"{fig.ceiling.rate():,.0f} proposals/s",
            "",
            None,
            f"{n:,} proposals, {fig.ceiling.settled_note()}; an OS process per real process "
            f"replays its recorded outputs and state under the same KafkaRunner; {same}",
        ),
        Row(
            "kafka pipeline: proposals/s to final decision",
            f"{fig.pipeline.rate():,.0f} proposals/s",
            "",
            None,
            f"{n:,} proposals, {fig.pipeline.settled_note()}: 70% reads, 20% low-impact, "
            f"10% high-impact mutations (→ approval_required); `callgate serve`'s OS "
            f"processes, one per process; {same}",
        ),
        Row(
            "kafka pipeline / ceiling",
            f"{ratio:.0%}",
            f"≥ {TARGET_RATIO:.0%}",
            ratio >= TARGET_RATIO,
            "both measured in this run",
        ),
        Row(
            "kafka ceiling of the three-process layout (before ADR 0077), no logic",
            f"{old.rate():,.0f} proposals/s",
            "",
            None,
            f"{n:,} proposals, {old.settled_note()}; the decider and the executor as two "
            f"processes, replayed the same way; {same}",
        ),
        Row(
            "kafka pipeline / three-process ceiling",
            f"{old_ratio:.0%}",
            "≥ 100%",
            old_ratio >= 1.0,
            "both measured in this run: the two-transaction pipeline, with its logic, "
            "against the earlier topology without any",
        ),
        *_latency_rows(fig, latency_s),
        Row(
            "kafka pipeline writes per proposal (check of the replay)",
            _per(fig.actual, fig.published),
            "",
            None,
            f"read back from the pipeline's topics, {fig.published:,} proposals; the replay "
            "writes the first row's figures",
        ),
    ]


def _earlier_latency_rows(fig: _Figures, rate: int) -> list[Row]:
    """The three-process layout's ceiling at ``rate``, when measured (ADR 0077's before)."""
    old = fig.earlier_latency.get(rate)
    if old is None:
        return []
    return [
        Row(
            f"kafka ceiling latency of the three-process layout at {rate}/s: "
            "to the outcome event; to status settled, p50 / p95 / p99",
            f"{old.pcts(outcome=True)}; {old.pcts()}",
            "",
            None,
            "the same proposals through the earlier layout's replay processes "
            f"(ADR 0077's before); {old.settled_note()}",
        )
    ]


def _latency_rows(fig: _Figures, latency_s: float) -> list[Row]:
    """Per offered load with a target: the pipeline's latency to the settled status record
    (the target), the ceiling's, and both to the outcome event on the ``events`` log."""
    rows: list[Row] = []
    for rate, target_ms in ((LOW_RATE, LOW_P99_MS), (TARGET_RATE, TARGET_P99_MS)):
        if rate not in fig.latency:
            continue
        mine, ceiling = fig.latency[rate], fig.ceiling_latency[rate]
        count = len(mine.latencies_ms) + len(mine.unsettled)
        rows += [
            Row(
                f"kafka latency at {rate}/s offered: p50 / p95 / p99",
                mine.pcts(),
                f"p99 ≤ {target_ms:g} ms",
                mine.pct(0.99) <= target_ms,
                f"{count:,} proposals over {latency_s:g} s, {mine.settled_note()}; "
                "scheduled publish → status settled",
            ),
            Row(
                f"kafka ceiling latency at {rate}/s offered: p50 / p95 / p99",
                ceiling.pcts(),
                "",
                None,
                "the same proposals through the replay processes: the topology's own "
                f"latency; {ceiling.settled_note()}",
            ),
            *_earlier_latency_rows(fig, rate),
            Row(
                f"kafka latency to the outcome event at {rate}/s: pipeline (ceiling)",
                f"{mine.pcts(outcome=True)} ({ceiling.pcts(outcome=True)})",
                "",
                None,
                "scheduled publish → the invocation's final outcome event on the events "
                "log (what a caller reading its own invocation there waits for: one "
                f"transaction and one hand-off fewer); {len(mine.outcome_ms):,} "
                f"({len(ceiling.outcome_ms):,}) seen",
            ),
            Row(
                f"kafka per hop at {rate}/s: pipeline, p50 (p99) ms",
                _hops(mine),
                "",
                None,
                f"{len(mine.hops.get(HOPS[0][0], [])):,} executed proposals, record "
                "timestamps on the events log; spans: "
                + "; ".join(f"{name}: {what}" for name, what in HOPS),
            ),
            Row(
                f"kafka per hop at {rate}/s: ceiling, p50 (p99) ms",
                _hops(ceiling),
                "",
                None,
                f"{len(ceiling.hops.get(HOPS[0][0], [])):,} executed proposals",
            ),
            Row(
                f"kafka broker CPU at {rate}/s: pipeline (ceiling)",
                f"{_cores(mine.broker_cores)} ({_cores(ceiling.broker_cores)}) "
                f"of {os.cpu_count()} cores",
                "",
                None,
                "the broker process alone, averaged over the timed load: what it leaves to "
                "the six processes (docs/explanation/benchmarks.md, 'Broker work per proposal')",
            ),
        ]
    return rows


def _plot_row(fig: _Figures, plot: str) -> list[Row]:
    return [
        Row(
            "kafka latency vs offered load",
            plot,
            "",
            None,
            _unsettled_points(fig)
            + "p50 / p99 ms, pipeline (ceiling) [cores used by other processes meanwhile]: "
            + "; ".join(
                f"{rate}/s {r.pct(0.5):,.0f} / {r.pct(0.99):,.0f} "
                f"({fig.ceiling_latency[rate].pct(0.5):,.0f} / "
                f"{fig.ceiling_latency[rate].pct(0.99):,.0f}) [{fig.others.get(rate, 0):.2f}]"
                for rate, r in sorted(fig.latency.items())
            ),
        )
    ]


def _cores(cores: float | None) -> str:
    return "?" if cores is None else f"{cores:.2f}"


def _hops(result: Result) -> str:
    """p50 (p99) ms per span of ``HOPS``."""
    return "; ".join(
        f"{name} {_at(xs, 0.5):.1f} ({_at(xs, 0.99):.1f})"
        for name, xs in ((n, result.hops.get(n, [])) for n, _ in HOPS)
    )


def _at(xs: Sequence[float], q: float) -> float:
    return xs[min(len(xs) - 1, max(0, round(q * len(xs)) - 1))] if xs else float("nan")


def _unsettled_points(fig: _Figures) -> str:
    """Offered loads at which some proposals did not settle (their latencies are left out)."""
    points = [
        f"{rate}/s {which}: {result.settled_note()}"
        for rate in sorted(fig.latency)
        for which, result in (
            ("pipeline", fig.latency[rate]),
            ("ceiling", fig.ceiling_latency[rate]),
        )
        if result.unsettled
    ]
    return "".join(f"{p}; " for p in points)


def shown(path: Path) -> str:
    """``path`` as printed: relative to the working directory, else its name only (no
    machine paths in a report that is pasted into the docs)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return f"{path.name} (in the state directory, or where --plot says)"


def _plot(figs: Mapping[str, _Figures], path: Path) -> str:
    """Latency percentiles against offered load, one panel per broker, as a PNG
    (matplotlib: a dev extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install -e '.[dev]')"
    figure, axes = plt.subplots(
        1, len(figs), figsize=(7.0 * len(figs), 4.8), sharey=True, squeeze=False
    )
    for ax, (broker, fig) in zip(axes[0], figs.items(), strict=True):
        _panel(ax, broker, fig)
    figure.suptitle(
        "callgate on Kafka: publish → final decision (loopback, one OS process per "
        f"process, {os.cpu_count()} cores)"
    )
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return shown(path)


def _panel(ax: Any, broker: str, fig: _Figures) -> None:
    assert fig.pipeline is not None
    rates = sorted(fig.latency)
    for q, style in ((0.5, "o-"), (0.95, "s-"), (0.99, "^-")):
        ys = [fig.latency[r].pct(q) for r in rates]
        ax.plot(rates, ys, style, label=f"pipeline p{q * 100:g}")
    for q, style in ((0.5, "o--"), (0.99, "^--")):
        ys = [fig.ceiling_latency[r].pct(q) for r in rates]
        ax.plot(rates, ys, style, color="grey", label=f"ceiling (no logic) p{q * 100:g}")
    ys = [fig.latency[r].pct(0.99, outcome=True) for r in rates]
    ax.plot(rates, ys, "v-.", color="tab:purple", label="pipeline p99, outcome event on the log")
    targets = [(r, ms) for r, ms in ((LOW_RATE, LOW_P99_MS), (TARGET_RATE, TARGET_P99_MS))]
    ax.plot(*zip(*targets, strict=True), "k*", markersize=10, label="p99 targets")
    ax.axvline(
        fig.pipeline.rate(),
        color="red",
        linestyle=":",
        linewidth=1,
        label="pipeline throughput (burst)",
    )
    ax.set(
        xlabel="offered load (proposals/s)",
        ylabel="publish → final decision (ms)",
        yscale="log",
        title=f"{broker} broker",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")


if __name__ == "__main__":
    raise SystemExit(replay_worker())
