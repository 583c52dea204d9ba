"""The Kafka section of ``callgate bench``: ceiling, pipeline throughput, latency.

Everything runs against a tansu broker this module starts on loopback (never the
deployment's), with the deployment's topic layout and ``callgate serve``'s process layout:
one OS process per process, each a ``KafkaRunner`` with the same batch and transaction
settings (``RUNNER_ARGS``). Method and figures: docs/benchmarks.md.

- **Recording.** Before anything is timed, the real processes run in-process over the
  proposals and every step is recorded: per process and input event, the key's state
  bytes after it and the outputs (the executor's ``follow_up`` too). This is also where
  the events, view records and state writes per proposal are measured.
- **Ceiling.** ``Replay`` processes, one per real process (same names, inputs and
  ``recovers``), look up the recorded step of each input and return it: the same events,
  view records and state bytes per hop, with no logic. The ratio pipeline / ceiling is
  callgate's own cost. A single-hop transactional passthrough of 400-byte records is
  measured too, as the broker's reference figure.
- **Final decision** is the first record of the ``status`` view topic for the invocation
  whose value says ``"settled":true`` (``callgate_projections.status``), as a
  ``read_committed`` consumer in the bench process receives it. Ceiling and pipeline use
  the same end point (the replayed status records are byte-identical).
- **Timed region.** Throughput: from the first publish of a burst of proposals to the
  final decision of the last one. Latency: proposals are published at a fixed rate; each
  latency is final decision minus its *scheduled* publish time (no coordinated omission).
  Start-up, group joins and a readiness probe run before any timer starts.
"""

from __future__ import annotations

import argparse
import json
import marshal
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from callgate import events as ev
from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.kafka.client import (
    FAST_GROUP_SETTINGS,
    fetched,
    make_producer,
    read_partitions_to_end,
)
from callgate.adapters.kafka.runner import KafkaRunner, ProducerFenced
from callgate.adapters.kafka.serve import Supervisor, create_topics, views_of
from callgate.adapters.kafka.tansu import TansuBroker
from callgate.adapters.kafka.topics import Topics, ensure_topics
from callgate.adapters.kafka.worker import consumer_overrides
from callgate.bench_core import Row, mixed_proposals
from callgate.bootstrap import App, Settings, bootstrap
from callgate.process import Output, Process, ViewRecord

# ``callgate serve``'s worker settings, passed explicitly to pipeline and ceiling alike.
BATCH_SIZE = 500
BATCH_TIMEOUT_MS = 20
# Tansu workarounds (DESIGN "Known tansu gaps"), for pipeline and ceiling alike: group joins
# take about session.timeout.ms; and tansu holds a fetch for the whole fetch.wait.max.ms even
# when records arrive meanwhile (Apache Kafka answers at once), so the default 500 ms would
# add about 200 ms per hop. Measured here: 500 -> 200 ms, 150 -> 27 ms, 100 -> 2 ms median.
CONSUMER = {k: str(v) for k, v in FAST_GROUP_SETTINGS.items()} | {"fetch.wait.max.ms": "10"}
RUNNER_ARGS = ["--batch-size", str(BATCH_SIZE), "--batch-timeout-ms", str(BATCH_TIMEOUT_MS)]
RUNNER_ARGS += [a for k, v in CONSUMER.items() for a in ("-X", f"{k}={v}")]

TARGET_RATE = 500  # proposals/s offered for the latency target
TARGET_P99_MS = 25.0
PLOT_RATES = (100, 250, 750, 1000, 1500)  # further points of the latency plot
HOP_RECORD_BYTES = 400
SETTLED = b'"settled":true'
STALL_S = 120.0  # no final decision for this long: the run failed

# Recorded outputs: ("e", avro bytes) or ("v", view, key, value json or None).
RecordedOutput = tuple[Any, ...]
Step = tuple[bytes | None, list[RecordedOutput]]  # (state after, or None if unchanged; outputs)


# --- recording and replay -----------------------------------------------------------------


def record(
    processes: Sequence[Process[Any]],
    inputs: Sequence[ev.Event],
    codec: AvroCodec,
    now_ms: int,
    out_dir: Path,
) -> tuple[dict[str, Path], Counter[str]]:
    """Run the real processes in-process over ``inputs`` and record every step.

    Events are delivered FIFO to every process that consumes their topic, as the runner
    would; ``follow_up`` runs after each step that emitted events, repeated while it emits.
    Returns one recording file per process and what was written per kind of topic
    (``events``, ``view.<view>``, ``changelog``: counts and ``<kind> bytes``).
    """
    codec_encode = codec.encode
    files: dict[str, Path] = {}
    written: Counter[str] = Counter()
    recs = {p.name: _Recording(p) for p in processes}
    queue: deque[ev.Event] = deque(inputs)
    while queue:
        event = queue.popleft()
        for proc in processes:
            if event.TOPIC not in proc.inputs:
                continue
            rec = recs[proc.name]
            state, outputs = proc.handle(rec.load(event.partition_key), event, now_ms)
            emitted = rec.step(
                rec.handled,
                event.event_id,
                event.partition_key,
                state,
                outputs,
                codec_encode,
                written,
            )
            while emitted:
                queue.extend(emitted)
                state, outputs = proc.follow_up(rec.states[event.partition_key], emitted, now_ms)
                emitted = rec.step(
                    rec.follow,
                    emitted[0].event_id,
                    event.partition_key,
                    state,
                    outputs,
                    codec_encode,
                    written,
                )
    for name, rec in recs.items():
        files[name] = out_dir / f"{name}.replay"
        files[name].write_bytes(marshal.dumps(rec.dump()))
    return files, written


class _Recording:
    def __init__(self, proc: Process[Any]) -> None:
        self.proc = proc
        self.initial = proc.dump_state(proc.initial_state())
        self.states: dict[str, Any] = {}
        self.blobs: dict[str, bytes] = {}
        self.handled: dict[str, Step] = {}
        self.follow: dict[str, Step] = {}

    def load(self, key: str) -> Any:
        if key in self.states:
            return self.states[key]
        return self.proc.initial_state()

    def step(
        self,
        table: dict[str, Step],
        event_id: str,
        key: str,
        state: Any,
        outputs: Sequence[Output],
        encode: Any,
        written: Counter[str],
    ) -> list[ev.Event]:
        self.states[key] = state
        blob = self.proc.dump_state(state)
        changed = blob != self.blobs.get(key, self.initial)
        if changed:
            self.blobs[key] = blob
            written["changelog"] += 1  # an upper bound: the runner writes once per txn
            written["changelog bytes"] += len(blob)
        recorded: list[RecordedOutput] = []
        emitted: list[ev.Event] = []
        for out in outputs:
            if isinstance(out, ViewRecord):
                recorded.append(("v", out.view, out.key, out.value_json))
                written[f"view.{out.view}"] += 1
                written[f"view.{out.view} bytes"] += len(out.value_json or "")
            else:
                data = encode(out)
                recorded.append(("e", data))
                emitted.append(out)
                written[out.TOPIC] += 1
                written[f"{out.TOPIC} bytes"] += len(data)
        if changed or recorded:
            table[event_id] = (blob if changed else None, recorded)
        return emitted

    def dump(self) -> dict[str, Any]:
        return {
            "name": self.proc.name,
            "inputs": sorted(self.proc.inputs),
            "recovers": self.proc.recovers,
            "initial": self.initial,
            "handled": self.handled,
            "follow": self.follow,
        }


class Replay:
    """A process with no logic: it returns the recorded state and outputs of each input.

    Implements ``callgate.process.Process[bytes]``; its state is the real process's state
    bytes, so the runner writes the same changelog records the real process causes.
    """

    def __init__(self, data: Mapping[str, Any], codec: AvroCodec) -> None:
        self.name: str = data["name"]
        self.inputs: frozenset[str] = frozenset(data["inputs"])
        self.recovers: bool = data["recovers"]
        self._initial: bytes = data["initial"]
        self._handled = {k: _decode_step(s, codec) for k, s in data["handled"].items()}
        self._follow = {k: _decode_step(s, codec) for k, s in data["follow"].items()}

    @classmethod
    def load(cls, path: Path, codec: AvroCodec) -> Replay:
        return cls(marshal.loads(path.read_bytes()), codec)

    def initial_state(self) -> bytes:
        return self._initial

    def handle(self, state: bytes, event: ev.Event, now_ms: int) -> tuple[bytes, Sequence[Output]]:
        step = self._handled.get(event.event_id)
        if step is None:
            return state, ()
        return (state if step[0] is None else step[0]), step[1]

    def follow_up(
        self, state: bytes, committed: Sequence[ev.Event], now_ms: int
    ) -> tuple[bytes, Sequence[Output]]:
        outputs: list[Output] = []
        for event in committed:
            step = self._follow.get(event.event_id)
            if step is not None:
                state = state if step[0] is None else step[0]
                outputs += step[1]
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


def _decode_step(step: Step, codec: AvroCodec) -> tuple[bytes | None, tuple[Output, ...]]:
    state, recorded = step
    outputs: list[Output] = []
    for out in recorded:
        if out[0] == "e":
            outputs.append(codec.decode(out[1]))
        else:
            outputs.append(ViewRecord(out[1], out[2], out[3]))
    return state, tuple(outputs)


def replay_worker(argv: Sequence[str] | None = None) -> int:
    """``python -m callgate.bench_kafka FILE ...``: one ``Replay`` under a ``KafkaRunner``,
    built exactly as ``callgate.adapters.kafka.worker`` builds a real process."""
    parser = argparse.ArgumentParser(description="Run one replay process (callgate bench).")
    parser.add_argument("recording", type=Path)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--batch-timeout-ms", type=int, required=True)
    parser.add_argument("-X", dest="consumer", action="append", default=[], metavar="KEY=VALUE")
    ns = parser.parse_args(argv)
    codec = AvroCodec.default()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    runner = KafkaRunner(
        Replay.load(ns.recording, codec),
        codec,
        Topics(ns.prefix, ns.partitions),
        ns.bootstrap_servers,
        "0",
        ns.state_dir,
        lambda: time.time_ns() // 1_000_000,
        batch_size=ns.batch_size,
        batch_timeout_ms=ns.batch_timeout_ms,
        consumer_overrides=consumer_overrides(ns.consumer),
    )
    try:
        runner.run(stop)
    except ProducerFenced:
        return 3
    return 0


# --- driving load and reading final decisions ---------------------------------------------


@dataclass(frozen=True, slots=True)
class Outbound:
    """A proposal ready to publish (encoded before any timer starts)."""

    invocation_id: bytes
    key: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class Result:
    seconds: float  # first scheduled publish to the last final decision
    latencies_ms: list[float]  # sorted

    def rate(self) -> float:
        return len(self.latencies_ms) / self.seconds

    def pct(self, q: float) -> float:
        xs = self.latencies_ms
        return xs[min(len(xs) - 1, max(0, round(q * len(xs)) - 1))]


class Load:
    """Publishes proposals and waits for their final decisions on the ``status`` view."""

    def __init__(self, bootstrap: str, topics: Topics) -> None:
        self.topics = topics
        self.requests = topics.physical("requests")
        # A platform publishing one call sends it at once: no linger.
        no_linger: dict[str, Any] = {"linger.ms": 0}
        self.producer: Producer = make_producer(bootstrap, None, **no_linger)
        self.reader = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "callgate.bench",  # assign() only: never joined or committed
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
            }
        )
        status = topics.view("status")
        meta = self.reader.list_topics(status, timeout=30).topics[status]
        self.reader.assign([TopicPartition(status, p, 0) for p in sorted(meta.partitions)])

    def run(self, items: Sequence[Outbound], rate: float | None = None) -> Result:
        """Publish ``items`` (all at once, or ``rate`` per second) until each is decided."""
        n = len(items)
        scheduled: dict[bytes, float] = {}
        latencies: list[float] = []
        sent = 0
        t0 = last = time.perf_counter()
        while len(latencies) < n:
            now = time.perf_counter()
            while sent < n and (rate is None or t0 + sent / rate <= now):
                item = items[sent]
                scheduled[item.invocation_id] = now if rate is None else t0 + sent / rate
                self._produce(item)
                sent += 1
            self.producer.poll(0)
            wait = 0.05 if rate is None or sent == n else max(0.0, t0 + sent / rate - now)
            for msg in fetched(self.reader, min(wait, 0.05)):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                value = msg.value()
                if value is None or SETTLED not in value:
                    continue
                sched = scheduled.pop(msg.key() or b"", None)
                if sched is not None and json.loads(value)["settled"] is True:
                    last = time.perf_counter()
                    latencies.append((last - sched) * 1000)
            if time.perf_counter() - max(last, t0 + sent / (rate or 1e9)) > STALL_S:
                raise TimeoutError(f"{n - len(latencies)} of {n} proposals never settled")
        return Result(last - t0, sorted(latencies))

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


def outbound(codec: AvroCodec, proposals: Sequence[ev.Event]) -> list[Outbound]:
    return [
        Outbound(p.invocation_id.encode(), p.partition_key.encode(), codec.encode(p))
        for p in proposals
    ]


def wait_joined(
    bootstrap: str, topics: Topics, names: Sequence[str], timeout_s: float = 60
) -> None:
    """Wait until every process's group has committed an input position after the probe:
    each process has joined, restored and handled input (before any timer starts).

    Not "committed up to the end of ``events``": on tansu a process's consumer does not get
    the records of its own last transaction until another producer writes the partition.
    """
    inputs = [topics.physical(t) for t in ("requests", "events")]
    want = [TopicPartition(t, p) for t in inputs for p in range(topics.partitions)]
    deadline = time.monotonic() + timeout_s
    for name in names:
        group = Consumer({"bootstrap.servers": bootstrap, "group.id": topics.group(name)})
        try:
            while max(tp.offset for tp in group.committed(want, timeout=10)) <= 0:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{name} has not joined within {timeout_s:g} s")
                time.sleep(0.1)
        finally:
            group.close()


# --- processes --------------------------------------------------------------------------------


@contextmanager
def replay_processes(
    files: Sequence[Path], bootstrap: str, topics: Topics, state_dir: Path
) -> Iterator[None]:
    """One OS process per recording, as ``callgate serve`` runs one per real process."""
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "callgate.bench_kafka",
                str(f),
                "--bootstrap-servers",
                bootstrap,
                "--prefix",
                topics.prefix,
                "--partitions",
                str(topics.partitions),
                "--state-dir",
                str(state_dir),
                *RUNNER_ARGS,
            ]
        )
        for f in files
    ]
    try:
        yield
    finally:
        _stop(children)


@contextmanager
def pipeline_processes(app: App) -> Iterator[None]:
    sup = Supervisor(app, [p.name for p in app.processes()], RUNNER_ARGS)
    sup.start()
    try:
        yield
    finally:
        sup.stop()


def _stop(children: Sequence[subprocess.Popen[bytes]]) -> None:
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


# --- the single-hop reference -----------------------------------------------------------------


def _padded(make: Any, size: int, codec: AvroCodec) -> ev.Event:
    """``make(padding)`` with the padding grown until the encoded event is ``size`` bytes."""
    pad = 0
    while True:
        event: ev.Event = make("x" * pad)
        got = len(codec.encode(event))
        if got == size:
            return event
        if got > size and pad == 0:
            raise ValueError(f"an empty event already takes {got} bytes")
        pad += 1 if got < size else -1


def single_hop(bootstrap: str, work: Path, partitions: int, n: int, codec: AvroCodec) -> Row:
    """Records/s through one transactional passthrough hop (no state), 400-byte records:
    the broker's reference figure (DESIGN "Known tansu gaps": 60,000-85,000/s)."""
    topics = Topics("bench-hop", partitions)
    inputs: list[ev.Event] = []
    handled: dict[str, Step] = {}
    for i in range(n):
        pk = f"hop-{i}"
        proposal = _padded(
            lambda pad, i=i, pk=pk: ev.ToolCallProposed(
                event_id=f"in-{i:08d}",
                invocation_id=pk,
                partition_key=pk,
                session_token="",
                tool="tickets.read",
                args_json=pad,
            ),
            HOP_RECORD_BYTES,
            codec,
        )
        output = _padded(
            lambda pad, i=i, pk=pk: ev.ExecutionSucceeded(
                event_id=f"out-{i:08d}",
                invocation_id=pk,
                partition_key=pk,
                execution_token="",
                result_json=pad,
            ),
            HOP_RECORD_BYTES,
            codec,
        )
        inputs.append(proposal)
        handled[proposal.event_id] = (None, [("e", codec.encode(output))])
    recording = work / "passthrough.replay"
    data = {
        "name": "passthrough",
        "inputs": ["requests"],
        "recovers": False,
        "initial": b"",
        "handled": handled,
        "follow": {},
    }
    recording.write_bytes(marshal.dumps(data))
    ensure_topics(
        AdminClient({"bootstrap.servers": bootstrap}), topics.specs([Replay(data, codec)])
    )
    producer = make_producer(bootstrap)
    for proposal in inputs:
        producer.produce(
            topics.physical("requests"),
            key=proposal.partition_key.encode(),
            value=codec.encode(proposal),
        )
        producer.poll(0)
    producer.flush(60)
    # The backlog is published before the runner starts; the clock starts at its first
    # committed transaction, so start-up and the group join are not timed.
    events = topics.physical("events")
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "callgate.bench",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    reader.assign([TopicPartition(events, p, 0) for p in range(partitions)])
    seen: set[bytes] = set()
    first_token: bytes | None = None
    in_first = 0
    t_first = t_last = 0.0
    with replay_processes([recording], bootstrap, topics, work / "hop-state"):
        while len(seen) < n:
            msgs = fetched(reader, 1.0)
            now = time.perf_counter()
            if not msgs and seen and now - t_last > STALL_S:
                raise TimeoutError(f"{n - len(seen)} of {n} passthrough records never arrived")
            for msg in msgs:
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                key = msg.key() or b""
                if key in seen:
                    continue  # a leftover of an aborted transaction (tansu shows them)
                seen.add(key)
                token = dict(msg.headers() or ()).get("cg-txn")
                if first_token is None:
                    first_token, t_first = token, now
                in_first += token == first_token
                t_last = now
    reader.close()
    if in_first == n:
        raise ValueError(f"{n} records fit one transaction: nothing to time")
    rate = (n - in_first) / (t_last - t_first)
    return Row(
        "kafka ceiling, reference: single-hop transactional passthrough",
        f"{rate:,.0f} records/s",
        "",
        None,
        f"{n:,} records of {HOP_RECORD_BYTES} B, transactions of ≤ {BATCH_SIZE}, 1 OS process, "
        "no state; timed from its first committed transaction to its last",
    )


# --- the section ------------------------------------------------------------------------------


def bench_kafka(settings: Settings, proposals: int, latency_s: float) -> list[Row]:
    """Ceiling, pipeline throughput and latency on an own tansu broker (see module doc).

    ``settings`` gives the partition count and profile; broker, topics and state are the
    bench's own (a temporary directory). The latency plot goes to
    ``<state_dir>/latency.png``.
    """
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="callgate-bench-kafka-"))
    try:
        with TansuBroker() as broker:
            rows = _run(settings, broker.bootstrap, work, proposals, latency_s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows.append(
        Row(
            "kafka: machine load during the section",
            f"{load_before:.2f} → {os.getloadavg()[0]:.2f}",
            "",
            None,
            f"1-minute load average before → after, {os.cpu_count()} cores; "
            "other work on the machine shows here",
        )
    )
    return rows


@dataclass(frozen=True, slots=True)
class _Runs:
    ceiling: Result
    ceiling_latency: Result
    pipeline: Result
    latency: dict[int, Result]


def _run(
    settings: Settings, bootstrap_servers: str, work: Path, n: int, latency_s: float
) -> list[Row]:
    codec = AvroCodec.default()
    app = bootstrap(
        Settings(
            state_dir=work / "pipeline",
            backend="kafka",
            bootstrap_servers=bootstrap_servers,
            topic_prefix="bench-pipeline",
            partitions=settings.partitions,
            profile=settings.profile,
        )
    )
    names = [p.name for p in app.processes()]
    probe = mixed_proposals(app, 10, seed=2)
    mix = mixed_proposals(app, n, seed=1)
    at_target = mixed_proposals(app, int(TARGET_RATE * latency_s), seed=3)
    plot_sets = {
        rate: outbound(codec, mixed_proposals(app, max(10, int(rate * latency_s / 2)), seed=10 + i))
        for i, rate in enumerate(PLOT_RATES)
    }
    # Record the real processes (their own state dir and effect ledger, the same keys).
    rec_dir = work / "recording"
    shutil.copytree(work / "pipeline" / "keys", rec_dir / "keys")
    rec_app = bootstrap(Settings(state_dir=rec_dir, profile=settings.profile))
    t0 = time.perf_counter()
    files, written = record(
        rec_app.processes(), [*probe, *mix, *at_target], codec, rec_app.clock(), rec_dir
    )
    recorded_s = time.perf_counter() - t0
    recorded_n = len(probe) + len(mix) + len(at_target)
    rows = [single_hop(bootstrap_servers, work, settings.partitions, max(5_000, 10 * n), codec)]

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    ceiling_topics = Topics("bench-ceiling", settings.partitions)
    ensure_topics(admin, ceiling_topics.specs(app.processes(), views_of(app)))
    with replay_processes(
        [files[name] for name in names], bootstrap_servers, ceiling_topics, work / "ceiling-state"
    ):
        ceiling, ceiling_latency = _measure(
            bootstrap_servers, ceiling_topics, names, codec, probe, mix, at_target, {}
        )
    pipeline_topics = Topics(app.settings.topic_prefix, app.settings.partitions)
    create_topics(app)
    with pipeline_processes(app):
        pipeline, latency = _measure(
            bootstrap_servers, pipeline_topics, names, codec, probe, mix, at_target, plot_sets
        )
    runs = _Runs(ceiling, ceiling_latency[TARGET_RATE], pipeline, latency)
    published = recorded_n + sum(len(s) for s in plot_sets.values())
    actual = _written(bootstrap_servers, pipeline_topics, views_of(app))
    plot = settings.state_dir / "latency.png"
    rows += _rows(runs, n, written, recorded_n, recorded_s, actual, published, latency_s, plot)
    return rows


def _measure(
    bootstrap_servers: str,
    topics: Topics,
    names: Sequence[str],
    codec: AvroCodec,
    probe: Sequence[ev.Event],
    mix: Sequence[ev.Event],
    at_target: Sequence[ev.Event],
    plot_sets: Mapping[int, Sequence[Outbound]],
) -> tuple[Result, dict[int, Result]]:
    """Probe (untimed: joins, restore), then throughput, then latency at each offered load."""
    load = Load(bootstrap_servers, topics)
    try:
        load.run(outbound(codec, probe))
        wait_joined(bootstrap_servers, topics, names)
        burst = outbound(codec, mix)
        paced = outbound(codec, at_target)
        throughput = load.run(burst)
        latency = {TARGET_RATE: load.run(paced, TARGET_RATE)}
        for rate, items in sorted(plot_sets.items()):
            latency[rate] = load.run(items, rate)
        return throughput, latency
    finally:
        load.close()


def _written(bootstrap_servers: str, topics: Topics, views: Mapping[str, str]) -> Counter[str]:
    """What the pipeline actually wrote to ``events`` and the view topics (after the runs)."""
    found: Counter[str] = Counter()
    kinds = {topics.physical("events"): "events"} | {topics.view(v): f"view.{v}" for v in views}
    for topic, kind in kinds.items():
        seen: set[tuple[int, bytes]] = set()
        for rec in read_partitions_to_end(bootstrap_servers, topic, timeout_s=120):
            ident = (rec.partition, (rec.key or b"") + b"\0" + (rec.value or b""))
            if ident in seen:
                continue  # a leftover of an aborted transaction repeats a committed record
            seen.add(ident)
            found[kind] += 1
            found[f"{kind} bytes"] += len(rec.value or b"")
    return found


def _per(counts: Mapping[str, int], kind: str, proposals: int) -> str:
    n = counts.get(kind, 0)
    size = counts.get(f"{kind} bytes", 0) / n if n else 0
    return f"{n / proposals:.2f} x {size:,.0f} B"


def _rows(
    runs: _Runs,
    n: int,
    recorded: Counter[str],
    recorded_n: int,
    recorded_s: float,
    actual: Counter[str],
    published: int,
    latency_s: float,
    plot: Path,
) -> list[Row]:
    ceiling, pipeline = runs.ceiling.rate(), runs.pipeline.rate()
    ratio = pipeline / ceiling
    target = runs.latency[TARGET_RATE]
    views = sorted(k for k in recorded if k.startswith("view.") and not k.endswith(" bytes"))
    topology = f"events {_per(recorded, 'events', recorded_n)}; " + "; ".join(
        f"{v} {_per(recorded, v, recorded_n)}" for v in views
    )
    check = f"events {_per(actual, 'events', published)}; " + "; ".join(
        f"{v} {_per(actual, v, published)}" for v in views
    )
    plot_note = _plot(runs, plot)
    return [
        Row(
            "kafka topology per proposal (recorded from the real processes)",
            topology,
            "",
            None,
            f"state writes ≤ {recorded['changelog'] / recorded_n:.2f} x "
            f"{recorded['changelog bytes'] / max(1, recorded['changelog']):,.0f} B; "
            f"6 processes read every event, the decider also the proposal; recorded "
            f"{recorded_n:,} proposals in-process in {recorded_s:.1f} s",
        ),
        Row(
            "kafka ceiling: same topology, no logic",
            f"{ceiling:,.0f} proposals/s",
            "",
            None,
            f"{n:,} proposals; 6 OS processes replay the recorded events, view records and "
            "state bytes under the same KafkaRunner; publish → status settled",
        ),
        Row(
            "kafka pipeline: proposals/s to final decision",
            f"{pipeline:,.0f} proposals/s",
            "",
            None,
            f"{n:,} proposals (70% reads, 20% low-impact, 10% high-impact → "
            "approval_required), `callgate serve`'s 6 OS processes; publish → status settled",
        ),
        Row(
            "kafka pipeline / ceiling",
            f"{ratio:.0%}",
            "≥ 50%",
            ratio >= 0.5,
            "same run, same broker, topics, partitions, event sizes and transactions",
        ),
        Row(
            f"kafka latency at {TARGET_RATE}/s offered: p50 / p95 / p99",
            f"{target.pct(0.5):.1f} / {target.pct(0.95):.1f} / {target.pct(0.99):.1f} ms",
            f"p99 ≤ {TARGET_P99_MS:g} ms",
            target.pct(0.99) <= TARGET_P99_MS,
            f"{len(target.latencies_ms):,} proposals over {latency_s:g} s, all settled; "
            "scheduled publish → status settled",
        ),
        Row(
            f"kafka ceiling latency at {TARGET_RATE}/s offered: p50 / p95 / p99",
            f"{runs.ceiling_latency.pct(0.5):.1f} / {runs.ceiling_latency.pct(0.95):.1f} / "
            f"{runs.ceiling_latency.pct(0.99):.1f} ms",
            "",
            None,
            "the same proposals through the replay processes: the floor of the topology",
        ),
        Row("kafka latency vs offered load", plot_note, "", None, _curve(runs.latency)),
        Row(
            "kafka pipeline writes per proposal (check of the replay)",
            check,
            "",
            None,
            f"read back after the runs, {published:,} proposals; the replay writes the "
            "recorded figures of the first row",
        ),
    ]


def _curve(latency: Mapping[int, Result]) -> str:
    return "; ".join(
        f"{rate}/s: p50 {r.pct(0.5):.0f}, p99 {r.pct(0.99):.0f} ms"
        for rate, r in sorted(latency.items())
    )


def _plot(runs: _Runs, path: Path) -> str:
    """Latency percentiles vs offered load (matplotlib, a dev extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install -e '.[dev]')"
    rates = sorted(runs.latency)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for q, style in ((0.5, "o-"), (0.95, "s-"), (0.99, "^-")):
        ax.plot(
            rates, [runs.latency[r].pct(q) for r in rates], style, label=f"pipeline p{q * 100:g}"
        )
    ceil = runs.ceiling_latency
    ax.plot([TARGET_RATE] * 2, [ceil.pct(0.5), ceil.pct(0.99)], "kx", label="ceiling p50, p99")
    ax.axhline(TARGET_P99_MS, color="grey", linestyle="--", linewidth=1, label="p99 target")
    ax.set_xlabel("offered load (proposals/s)")
    ax.set_ylabel("publish → final decision (ms)")
    ax.set_yscale("log")
    ax.set_title(
        f"callgate on Kafka (tansu, loopback): pipeline saturates near "
        f"{runs.pipeline.rate():,.0f}/s"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


if __name__ == "__main__":
    raise SystemExit(replay_worker())
