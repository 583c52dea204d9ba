"""``python -m tools soak``: two ``callgate serve`` instances on Apache Kafka under a steady
load for a long while, and whether anything grows (issue 42, "A soak").

One run:

1. its own broker (``tools.apache_kafka``), a fresh state directory and topic prefix, and
   two ``callgate serve --instance-id soak-N`` processes (the installed command, each with
   its worker children), sharing the partitions;
2. the chaos run's flows (``tools.chaos.Workload``: reads, keyed creations, calls
   approved by their owner or an approver, denials, forbidden calls, spoofs, bad
   sessions, a usage limit), launched so that ``--rate`` proposals a second are
   published, for ``--seconds``; no fault is injected;
3. every ``--every`` seconds a sample: proposals settled per second, p50 and p99 of the
   time from a proposal's publication to its settled status, resident memory (RSS) and
   open files of each instance (the serve process and its children; the CSV also has the
   RSS of each process), and the consumer lag of every process group (log end minus
   committed position, summed); printed as a table at the end and written as CSV;
4. the verdict of the chaos run (``tools.chaos.verify``: nothing lost, no effect twice,
   no unapproved high-impact effect, audit chain and replay equal), no ``error`` line in
   the instances' logs, and flat curves: for RSS, open files, consumer lag and p99, the
   mean of the last window is at most 10% above the mean of the first (windows of five
   minutes, or half of what follows the first minute on a shorter run; the first minute
   is warm-up and left out). Lag and p99 get a floor (``LAG_FLOOR``, ``P99_FLOOR_MS``) so
   that noise on near-zero values does not count as growth.
"""

from __future__ import annotations

import contextlib
import csv
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from rich.table import Table

from callgate.adapters.kafka.client import LIBRDKAFKA_LOG, make_admin
from callgate.adapters.kafka.serve import create_topics
from callgate.adapters.kafka.topics import Topics
from callgate.application.replay import replay
from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.codes import Code
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.render import Renderer
from callgate.surfaces.sdk import Gateway
from tools import exit_on_signal
from tools.apache_kafka import ApacheKafka, KafkaUnavailable
from tools.chaos import (
    STEP_TIMEOUT_S,
    Evidence,
    Script,
    Wait,
    Workload,
    draw_kind,
    limited_profile,
    verify,
)
from tools.chaos import _render as render_verdict

WARM_UP_S = 60.0  # left out of the growth check
WINDOW_S = 300.0  # the first and last windows compared (five minutes)
GROWTH = 0.10  # the last window's mean may be at most this much above the first's
LAG_FLOOR = 50  # records: a lag below this is not growth
P99_FLOOR_MS = 50.0  # a p99 within this of the first window's is not growth
SERVE_STOP_S = 20.0  # serve's grace is 10 s
MAX_IN_FLIGHT = 2000  # flows; past it the load is not steady (callgate fell behind)


@dataclass
class Sample:
    t: float  # seconds since the load began
    calls_s: float
    p50_ms: float
    p99_ms: float
    rss_mb: list[float]
    fds: list[int]
    lag: int
    in_flight: int
    by_process: dict[str, float] = field(default_factory=dict)  # RSS MB, CSV only

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "t_s": round(self.t),
            "calls_s": round(self.calls_s, 1),
            "p50_ms": round(self.p50_ms, 1),
            "p99_ms": round(self.p99_ms, 1),
        }
        for n, (rss, fds) in enumerate(zip(self.rss_mb, self.fds, strict=True)):
            out[f"rss_mb_{n}"] = round(rss, 1)
            out[f"fds_{n}"] = fds
        return out | {"lag": self.lag, "in_flight": self.in_flight}


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux ``/proc``)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return found


def rss_mb(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def rss_by_process(server: Instance) -> dict[str, float]:
    """RSS of the serve process and of each worker child, by ``<instance>/<process>``."""
    out: dict[str, float] = {}
    for pid in server.pids():
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            name = argv[3].decode() if b"callgate.surfaces.kafka_worker" in argv[:3] else "serve"
            out[f"{server.name}/{name}"] = round(rss_mb([pid]), 1)
    return out


def open_fds(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{pid}/fd"))
    return total


class Lag:
    """Consumer lag of every process group: log end minus committed position, summed."""

    def __init__(self, app: App) -> None:
        self.topics = Topics(app.settings.topic_prefix, app.settings.partitions)
        self.groups = {self.topics.group(p.name): sorted(p.inputs) for p in app.processes()}
        brokers = app.settings.brokers
        self.admin = make_admin(brokers)
        self.consumer = Consumer(
            {"bootstrap.servers": brokers, "group.id": "soak-lag", "logger": LIBRDKAFKA_LOG,
             "isolation.level": "read_committed", "enable.auto.commit": False}
        )  # fmt: skip

    def total(self) -> int:
        ends: dict[tuple[str, int], int] = {}
        lag = 0
        for group, inputs in self.groups.items():
            parts = [
                TopicPartition(self.topics.physical(t), p)
                for t in inputs
                for p in range(self.topics.partitions)
            ]
            request = [ConsumerGroupTopicPartitions(group, parts)]
            result = self.admin.list_consumer_group_offsets(request, request_timeout=10)
            committed = result[group].result().topic_partitions
            for tp in committed:
                key = (tp.topic, tp.partition)
                if key not in ends:
                    ends[key] = self.consumer.get_watermark_offsets(
                        TopicPartition(tp.topic, tp.partition), timeout=10
                    )[1]
                lag += max(0, ends[key] - max(tp.offset, 0))
        return lag

    def close(self) -> None:
        self.consumer.close()


@dataclass
class Instance:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def pids(self) -> list[int]:
        return tree(self.proc.pid) if self.proc.poll() is None else []

    def stop(self) -> int | None:
        """SIGTERM; its exit code, None when it did not stop within its grace."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(SERVE_STOP_S)
        except subprocess.TimeoutExpired:
            for pid in reversed(self.pids()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait()
            return None


def start_instance(app: App, n: int) -> Instance:
    s = app.settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env |= {"CALLGATE_DEV": "1", "CALLGATE_TOPIC_PREFIX": s.topic_prefix,
            "CALLGATE_PARTITIONS": str(s.partitions)}  # fmt: skip
    callgate = str(Path(sys.executable).with_name("callgate"))
    argv = [callgate, "--state-dir", str(s.state_dir), "--profile", str(s.profile),
            "--backend", "kafka", "--bootstrap-servers", str(s.bootstrap_servers),
            "--log-format", "json", "serve", "--instance-id", f"soak-{n}"]  # fmt: skip
    log = s.state_dir / f"serve-{n}.log"
    with log.open("ab") as f:
        proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT)
    return Instance(f"soak-{n}", proc, log)


@dataclass
class _Load:
    """Flows launched to hold ``rate`` proposals a second; the latencies of the interval."""

    gate: Gateway
    work: Workload
    rate: float
    pending: list[ev.Event]  # what the flows sent, published at once
    active: dict[int, tuple[Script, Wait]] = field(default_factory=dict)
    launched: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, this interval
    settled: int = 0  # statuses seen settled, this interval
    overload: bool = False

    def publish(self) -> None:
        if self.pending:
            self.gate.backend.publish(self.pending)
            self.pending.clear()

    def step(self, began: float, launching: bool) -> None:
        self.publish()  # what the flows sent as they advanced
        now = time.monotonic()
        due = self.rate * (now - began)
        while launching and self.work.counts.proposals < due:
            if len(self.active) >= MAX_IN_FLIGHT:
                self.overload = True
                break
            i = self.launched
            script = self.work.script(i, draw_kind(self.work.rng))
            self.active[i] = (script, next(script))
            self.launched += 1
        self.publish()
        self.gate.backend.wait(lambda: False, 0.02)
        now = time.monotonic()
        for i, (script, wait) in list(self.active.items()):
            value = self.gate.backend.view(wait.view, wait.key)
            if value is not None and wait.ready(value):
                if wait.view == "status" and not wait.after and not wait.final:
                    self.latencies.append(now - wait.since)
                    self.settled += 1
                try:
                    self.active[i] = (script, script.send(value))
                except StopIteration:
                    del self.active[i]
            elif now - wait.since > STEP_TIMEOUT_S:
                self.work.failures.append(f"flow {i}: no answer for {wait.view} {wait.key}")
                script.close()
                del self.active[i]


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def growth(samples: Sequence[Sample], seconds: float) -> dict[str, tuple[float, float, bool]]:
    """Per curve: (first window's mean, last window's mean, flat?) (module docstring)."""
    window = min(WINDOW_S, (seconds - WARM_UP_S) / 2)
    first = [s for s in samples if WARM_UP_S <= s.t < WARM_UP_S + window]
    last = [s for s in samples if s.t >= seconds - window]
    out: dict[str, tuple[float, float, bool]] = {}
    if not first or not last:
        return out
    curves: dict[str, Any] = {
        "p99_ms": (lambda s: s.p99_ms, P99_FLOOR_MS),
        "lag": (lambda s: float(s.lag), float(LAG_FLOOR)),
    }
    for n in range(len(samples[0].rss_mb)):
        curves[f"rss_mb_{n}"] = (lambda s, n=n: s.rss_mb[n], 0.0)
        curves[f"fds_{n}"] = (lambda s, n=n: float(s.fds[n]), 0.0)
    for name, (value, floor) in curves.items():
        a = statistics.fmean(value(s) for s in first)
        b = statistics.fmean(value(s) for s in last)
        out[name] = (a, b, b <= max(a * (1 + GROWTH), a + floor))
    return out


def run_soak(
    settings: Settings,
    out: Renderer,
    *,
    seconds: float = 1800.0,
    rate: float = 50.0,
    every: float = 20.0,
    csv_path: Path | None = None,
    instances: int = 2,
    seed: int = 7,
) -> int:
    """The soak (module docstring); 0 when every check holds, else 1."""
    if settings.bootstrap_servers:
        out.error(Code.USAGE, "soak starts the run's own broker: no --bootstrap-servers")
        return 2
    if not (10 <= every <= 60) or seconds < 2 * every or rate <= 0:
        out.error(Code.USAGE, "--every 10..60 s, --seconds at least two samples, --rate > 0")
        return 2
    previous = signal.signal(signal.SIGTERM, exit_on_signal)  # stop what it started, even then
    state = Path(tempfile.mkdtemp(prefix="callgate-soak-"))
    broker: ApacheKafka | None = None
    servers: list[Instance] = []
    ok = False
    try:
        try:
            broker = ApacheKafka().start()
        except KafkaUnavailable as exc:
            out.error(Code.BROKER_UNAVAILABLE, f"soak: no Apache Kafka broker: {exc}")
            return 1
        flows = int(rate * seconds) + 1
        run = settings.model_copy(
            update={
                "state_dir": state,
                "backend": "kafka",
                "bootstrap_servers": broker.bootstrap,
                "topic_prefix": f"soak-{uuid.uuid4().hex[:8]}",
                "profile": limited_profile(state, flows),
                "dev": True,
            }
        )
        app = bootstrap(run)
        app.keys  # noqa: B018  (key material exists before the instances start)
        create_topics(app)
        servers = [start_instance(app, n) for n in range(instances)]
        report = _soak(app, servers, out, seconds, rate, every, csv_path, seed)
        ok = not report["violations"]
        render_verdict(out, report, ok, name="soak", zero=("error lines in the logs",),
                       true=("curves flat",))  # fmt: skip
        return 0 if ok else 1
    finally:
        for server in servers:
            server.stop()
        if broker is not None:
            broker.stop()
        signal.signal(signal.SIGTERM, previous)
        if ok:
            shutil.rmtree(state, ignore_errors=True)
        else:
            out.err.print(f"[yellow]soak: state and logs kept in {state}[/]")


def _soak(
    app: App,
    servers: list[Instance],
    out: Renderer,
    seconds: float,
    rate: float,
    every: float,
    csv_path: Path | None,
    seed: int,
) -> dict[str, Any]:
    rng = random.Random(seed)
    gate = Gateway(app, app.kafka_backend())
    lag = Lag(app)

    def send(event: ev.Event) -> None:
        pending.append(event)

    pending: list[ev.Event] = []
    work = Workload(app, rng, send)
    load = _Load(gate, work, rate, pending)
    samples: list[Sample] = []
    exited: list[str] = []
    try:
        _wait_ready(load, servers)
        began = time.monotonic()
        next_sample = began + every
        while time.monotonic() - began < seconds:
            load.step(began, launching=True)
            for server in servers:
                if server.proc.poll() is not None and server.name not in exited:
                    exited.append(server.name)
            if time.monotonic() >= next_sample:
                samples.append(_sample(load, servers, lag, time.monotonic() - began, every))
                next_sample += every
                if not out.json_mode:
                    r = samples[-1].row()
                    out.err.print(f"[dim]soak: {r}[/]")
        drain_until = time.monotonic() + STEP_TIMEOUT_S
        while load.active and time.monotonic() < drain_until:
            load.step(began, launching=False)
        statuses = _statuses(gate, work)
        verified = gate.verify_audit()
        replayed = replay(gate)
        evidence = Evidence(
            calls=work.calls,
            statuses=statuses,
            effects=gate.effects(),
            audit=gate.audit(
                session=app.session_issuer.issue(
                    "soak-operator", "soak", [OPERATOR_ROLE], app.clock()
                )
            ),
            events=list(gate.backend.read_events()),
            flow_failures=work.failures,
        )
    finally:
        lag.close()
        gate.close()
    stopped = [s.stop() for s in servers]
    errors = [
        line[:300]
        for s in servers
        for line in s.log.read_text(errors="replace").splitlines()
        if '"level": "error"' in line or '"level":"error"' in line or "Traceback" in line
    ]
    verdict = verify(evidence, app.profile)
    if not verified.ok:
        verdict.violations.append(f"audit chain: {verified.first_bad}: {verified.reason}")
    if not replayed["equal"]:
        differing = {k: v["differing"] for k, v in replayed["views"].items() if not v["equal"]}
        verdict.violations.append(f"replay differs from the live views: {differing}")
    verdict.violations += [f"error line in the logs: {e}" for e in errors[:20]]
    verdict.violations += [f"serve {name} exited during the soak" for name in exited]
    verdict.violations += [
        f"serve soak-{n} did not stop within {SERVE_STOP_S:g} s"
        for n, code in enumerate(stopped)
        if code is None
    ]
    if load.overload:
        verdict.violations.append(f"more than {MAX_IN_FLIGHT} flows in flight: not steady")
    flat = growth(samples, seconds)
    if not flat:
        verdict.violations.append(
            f"too short to judge growth: no samples past the first {WARM_UP_S:g} s of warm-up"
        )
    verdict.violations += [
        f"{name} grew: {a:.1f} -> {b:.1f} (more than {GROWTH:.0%})"
        for name, (a, b, holds) in flat.items()
        if not holds
    ]
    if csv_path is not None and samples:
        names = sorted({k for s in samples for k in s.by_process})
        with csv_path.open("w", newline="") as f:
            columns = [*samples[0].row(), *(f"rss_mb {n}" for n in names)]
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            for s in samples:
                rss = {f"rss_mb {n}": s.by_process.get(n, "") for n in names}
                writer.writerow(s.row() | rss)
    _print_curves(out, samples)
    calls = [s.calls_s for s in samples]
    figures: dict[str, Any] = {
        "seconds": seconds,
        "rate asked (proposals/s)": rate,
        "proposals": work.counts.proposals,
        "flows": load.launched,
        "calls/s settled (mean)": round(statistics.fmean(calls), 1) if calls else 0,
        "samples": len(samples),
        **{
            f"{name}: first -> last window": f"{a:.1f} -> {b:.1f} ({'flat' if ok else 'GREW'})"
            for name, (a, b, ok) in flat.items()
        },
        "curves flat": bool(flat) and all(ok for _, _, ok in flat.values()),
        "error lines in the logs": len(errors),
        **verdict.figures,
        "audit chain ok": verified.ok,
        "audit records": verified.records,
        "replay equal": bool(replayed["equal"]),
        "replayed events": replayed["events"],
        "csv": str(csv_path) if csv_path else "",
    }
    return {"figures": figures, "samples": [s.row() for s in samples],
            "violations": verdict.violations, "seed": seed}  # fmt: skip


def _wait_ready(load: _Load, servers: list[Instance]) -> None:
    """Until one call settles: the instances are up and own the partitions (not timed)."""
    deadline = time.monotonic() + 180
    script = load.work.script(-1, "read")
    wait = next(script)
    load.publish()
    while time.monotonic() < deadline:
        if any(s.proc.poll() is not None for s in servers):
            raise RuntimeError("a serve instance exited while starting")
        load.gate.backend.wait(lambda: False, 0.2)
        value = load.gate.backend.view(wait.view, wait.key)
        if value is not None and wait.ready(value):
            with contextlib.suppress(StopIteration):
                script.send(value)
            return
    raise RuntimeError("no call settled within 180 s of the instances' start")


def _sample(load: _Load, servers: list[Instance], lag: Lag, t: float, every: float) -> Sample:
    lat = [x * 1000 for x in load.latencies]
    sample = Sample(
        t=t,
        calls_s=load.settled / every,
        p50_ms=percentile(lat, 0.50),
        p99_ms=percentile(lat, 0.99),
        rss_mb=[rss_mb(s.pids()) for s in servers],
        fds=[open_fds(s.pids()) for s in servers],
        lag=_lag(lag),
        in_flight=len(load.active),
        by_process={k: v for s in servers for k, v in rss_by_process(s).items()},
    )
    load.latencies, load.settled = [], 0
    return sample


def _lag(lag: Lag) -> int:
    try:
        return lag.total()
    except Exception:  # a sample without lag is reported as -1, not a crash
        return -1


def _statuses(gate: Gateway, work: Workload) -> dict[str, dict[str, Any]]:
    gate.backend.wait(lambda: False, 2.0)
    return {i: gate.backend.view("status", i) or {} for i in work.calls}


def _print_curves(out: Renderer, samples: Sequence[Sample]) -> None:
    if out.json_mode or not samples:
        return
    rows = [s.row() for s in samples]
    t = Table(title="soak: the curves")
    for column in rows[0]:
        t.add_column(column, justify="right")
    for row in rows:
        t.add_row(*(str(v) for v in row.values()))
    out.err.print(t)
