"""``python -m tools disk-full``: the embedded backend on a disk that fills up under load and
then has space again (issue 42, "A full disk"; ADR 0084).

One run:

1. a tmpfs of ``--size`` MiB, mounted in a mount namespace of the run's own
   (``tools.small_disk``), holds the state directory: the event store, the simulated
   providers' effect ledger, the keys, an exporter's position. ``callgate serve --http``
   runs on it (its log is kept outside it);
2. ``--proposals`` flows of the chaos run's workload (``tools.chaos.Workload``: reads,
   keyed creations with replays and conflicting keys, calls approved by their owner or by
   an approver, denials, forbidden calls, identity spoofs, bad sessions, a usage limit;
   10% of the requests sent twice) go through the SDK on the store, up to 200 at a time;
3. ``--faults`` times, from ``--fill-at`` of the flows done on, a ballast file takes every
   free block of the filesystem while ``serve`` has rows still to handle, and keeps them
   ``--hold`` seconds, taking back any space freed meanwhile, and then until every surface
   has met the full disk (at most ``BITE_WAIT_S`` more): every write on it fails (ENOSPC).
   The flows go on: a request the store refuses (``storage_unavailable``: nothing of it
   was recorded) is sent again a little later, as an agent would. Meanwhile the command
   line (``callgate propose``), the HTTP API (``POST /v1/proposals``) and ``callgate
   mcp`` (``tools/call`` over stdio) are asked for a call again and again
   (``tools.disk_surfaces``), and an exporter's position and a new key pair are written
   on the full disk;
4. the ballast is deleted; nobody touches ``serve``. The time a fault cost is from the
   space coming back to the next call executed;
5. once every flow is done, the verdict: the chaos run's checks (``tools.chaos.verify``:
   nothing lost, no effect twice, no high-impact effect without its approval, every
   effect reported, the usage limit kept), and: every answer given during a fault is
   ``storage_unavailable`` or names a call the log holds (never ``allowed`` or
   ``executed`` for a call not recorded), each surface answered ``storage_unavailable``
   during each fault, no surface printed a traceback; the files written on the full disk
   failed whole (the old position and key set as they were, no temporary file left);
   ``serve`` logged each refusal and recovery and stopped cleanly; both SQLite files pass
   ``PRAGMA integrity_check``; ``callgate audit verify`` holds and ``callgate replay``
   equals the live views. Exit 0 only if all hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from callgate.adapters.embedded.backend import EmbeddedBackend
from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.codes import Code, Rejection
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.render import Renderer
from callgate.surfaces.sdk import Gateway
from tools import small_disk
from tools.chaos import (
    EXECUTED,
    STEP_TIMEOUT_S,
    WINDOW,
    Evidence,
    Script,
    Wait,
    Workload,
    _Outbox,
    _render,
    limited_profile,
    pick_kind,
    verify,
)
from tools.disk_surfaces import (
    PROBE_TIMEOUT_S,
    SURFACES,
    Answer,
    Deployment,
    prepare_files,
    write_on_full_disk,
)
from tools.ports import free_port

STORAGE = Code.STORAGE_UNAVAILABLE.value
STORES = ("events.sqlite3", "effects.sqlite")
LAST_FILL_AT = 0.85  # of the flows done: the last fault starts before this
BITE_WAIT_S = 30.0  # past --hold, a fault waits this long for every surface to meet it
# Figures that must be 0, or true, beside the chaos run's (``tools.chaos._render``).
ZERO = (
    "answers of unrecorded calls",
    "probe answers outside the vocabulary",
    "tracebacks",
    "files left half written",
    "requests refused outside a fault",
)
TRUE = ("store integrity ok", "serve logged each refusal and recovery", "serve stopped cleanly")


@dataclass
class Fault:
    """One full disk: when (``time.monotonic``), how it bit and what it cost."""

    at: float  # share of the flows done from which it may start
    fills: int = 0  # fills tried: one that finds serve caught up is given back
    wal_bytes: int = 0  # what the write-ahead logs held, cut before the fill
    backlog: int = 0  # rows serve had still to handle with the disk full
    ballast_bytes: int = 0
    filled_at: float = 0.0
    back_at: float = 0.0
    back_epoch_ms: int = 0
    cost_s: float | None = None  # space back -> the next call executed
    refused: set[str] = field(default_factory=set)  # requests the store refused (SDK), by id
    refused_appends: int = 0

    @property
    def active(self) -> bool:
        return bool(self.filled_at) and not self.back_at


class Timeline:
    """The run's faults, one after the other."""

    def __init__(self, faults: int, fill_at: float) -> None:
        step = (LAST_FILL_AT - fill_at) / faults
        self.faults = [Fault(fill_at + k * step) for k in range(faults)]
        self.stray: set[str] = set()  # requests refused while no fault was on

    def active(self) -> int | None:
        return next((i for i, f in enumerate(self.faults) if f.active), None)

    def due(self, done_share: float) -> Fault | None:
        """The next fault to start, once its share of the flows is done and the one before
        has been recovered from (a call executed since): each fault is timed on its own."""
        waiting = [f for f in self.faults if not f.filled_at]
        ended = [f for f in self.faults if f.back_at]
        if any(f.cost_s is None for f in ended) or self.active() is not None:
            return None
        return waiting[0] if waiting and done_share >= waiting[0].at else None

    @property
    def over(self) -> bool:
        return all(f.back_at for f in self.faults)


class _RefusingOutbox(_Outbox):
    """The chaos outbox whose append the store may refuse: the requests stay and are sent
    again at the next flush (nothing of them was recorded, ADR 0084)."""

    def __init__(self, gate: Gateway, rng: random.Random, timeline: Timeline) -> None:
        super().__init__(gate.backend.publish, rng)
        self.timeline = timeline

    def flush(self, everything: bool = False) -> None:
        try:
            super().flush(everything)
        except Rejection as r:
            if r.code is not Code.STORAGE_UNAVAILABLE:
                raise
            ids = {event.event_id for event in self._now}
            active = self.timeline.active()
            if active is None:
                self.timeline.stray |= ids
                return
            self.timeline.faults[active].refused |= ids
            self.timeline.faults[active].refused_appends += 1


class Probes(threading.Thread):
    """Asks each surface for a call, one after the other, while a fault is on."""

    def __init__(self, deployment: Deployment, timeline: Timeline) -> None:
        super().__init__(name="disk-full-probes", daemon=True)
        self.deployment, self.timeline = deployment, timeline
        self.stop = threading.Event()
        self.answers: list[Answer] = []

    def run(self) -> None:
        while not self.stop.is_set():
            if self.timeline.active() is None:
                self.stop.wait(0.05)
                continue
            for surface in SURFACES:
                self.answers.append(self.deployment.probe(surface, self.timeline.active()))
            self.stop.wait(0.2)

    def answered_all(self, fault: int) -> bool:
        """Every surface answered at least once during ``fault``."""
        return {a.surface for a in self.answers if a.fault == fault} >= set(SURFACES)

    def refused_all(self, fault: int) -> bool:
        """Every surface answered ``storage_unavailable`` during ``fault``: each met it."""
        met = {a.surface for a in self.answers if a.fault == fault and a.code == STORAGE}
        return met >= set(SURFACES)


def run_disk_full(
    settings: Settings,
    out: Renderer,
    proposals: int = 1000,
    faults: int = 1,
    hold_s: float = 5.0,
    fill_at: float = 0.3,
    size_mb: int = 256,
    seed: int = 7,
    keep: bool = False,
) -> int:
    """The campaign (module docstring); 0 when every check holds, else 1 (2: misuse).
    ``keep``: keep serve's log and the probes' even when every check holds."""
    if proposals < 1 or faults < 1 or hold_s < 0 or not 0 < fill_at < LAST_FILL_AT:
        out.error(
            Code.USAGE,
            f"--proposals and --faults at least 1, --hold at least 0, --fill-at between 0 "
            f"and {LAST_FILL_AT}",
        )
        return 2
    if size_mb < 16:
        out.error(Code.USAGE, "--size: at least 16 MiB")
        return 2
    if os.environ.get(small_disk.INSIDE_ENV) != "1":
        return _in_namespace(out)
    callgate = shutil.which("callgate") or str(Path(sys.executable).parent / "callgate")
    root = Path(tempfile.mkdtemp(prefix="callgate-disk-full-"))
    disk = root / "disk"
    small_disk.mount_tmpfs(disk, size_mb)
    state = disk / "state"
    state.mkdir()
    ok = False
    try:
        profile = limited_profile(root, proposals)
        run_settings = settings.model_copy(
            update={
                "state_dir": state,
                "backend": "embedded",
                "profile": profile,
                "faults": {},
                "dev": True,
            }
        )
        app = bootstrap(run_settings)
        app.keys  # noqa: B018  (the keys exist before serve starts, so both share them)
        token = app.session_issuer.issue("alice", "acme", ["support"], app.clock(), 86_400)
        deployment = Deployment(app, state, profile, root, free_port(), token, callgate)
        started = time.monotonic()
        timeline = Timeline(faults, fill_at)
        report = _campaign(deployment, out, proposals, timeline, hold_s, seed, disk)
        report["figures"]["disk (tmpfs) MiB"] = size_mb
        report["figures"]["elapsed s"] = round(time.monotonic() - started, 1)
        ok = not report["violations"]
        _render(out, report, ok, name="disk-full", zero=ZERO, true=TRUE)
        return 0 if ok else 1
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=False)
        if ok and not keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            out.err.print(f"[yellow]disk-full: serve's log kept in {root}[/]")


def _in_namespace(out: Renderer) -> int:
    """Run this very command again inside a mount namespace of its own (``small_disk``)."""
    reason = small_disk.unavailable()
    if reason is not None:
        out.error(Code.USAGE, f"disk-full needs a size-limited filesystem to fill: {reason}")
        return 2
    env = {**os.environ, small_disk.INSIDE_ENV: "1"}
    command = [*small_disk.namespace_argv(), sys.executable, "-m", "tools", *sys.argv[1:]]
    return subprocess.run(command, env=env, check=False).returncode


def _campaign(
    deployment: Deployment,
    out: Renderer,
    n: int,
    timeline: Timeline,
    hold_s: float,
    seed: int,
    disk: Path,
) -> dict[str, Any]:
    rng = random.Random(seed)
    prepare_files(deployment.state)
    deployment.start_serve()
    # Each surface once before the faults (``callgate mcp`` creates its key at its first run).
    before = [deployment.probe(surface, None) for surface in SURFACES]
    gate = Gateway(deployment.app, deployment.app.embedded_backend())
    outbox = _RefusingOutbox(gate, rng, timeline)
    work = Workload(deployment.app, rng, outbox.send)
    probes = Probes(deployment, timeline)
    ballast = small_disk.Ballast(disk / "ballast")
    file_problems: list[str] = []
    peak = [0]
    try:
        probes.start()
        driver = _Driver(
            gate, work, outbox, timeline, probes, ballast, out, _backlog(gate, deployment.app)
        )
        driver.on_full = lambda: file_problems.extend(write_on_full_disk(deployment.state))
        driver.drive(n, hold_s, peak)
        probes.stop.set()
        probes.join(PROBE_TIMEOUT_S * len(SURFACES))
        statuses = _settle(gate, {*work.calls, *deployment.probe_calls})
        after = [deployment.probe(surface, None) for surface in SURFACES]
        statuses.update(_settle(gate, set(deployment.probe_calls) - set(statuses)))
        audit_ok, audit_records = _command(deployment, "audit", "verify", ok="ok", n="records")
        replay_ok, replayed = _command(deployment, "replay", ok="equal", n="events")
        evidence = Evidence(
            calls={**work.calls, **deployment.probe_calls},
            statuses=statuses,
            effects=gate.effects(),
            audit=gate.audit(session=_operator(deployment.app)),
            events=list(gate.backend.read_events()),
            flow_failures=work.failures,
        )
    finally:
        probes.stop.set()
        ballast.release()
        gate.close()
        stopped = deployment.stop_serve()
    verdict = verify(evidence, deployment.app.profile)
    answers = [*before, *probes.answers, *after]
    unrecorded = unrecorded_answers(answers, statuses)
    during = [a for a in answers if a.fault is not None]
    refused_lines, recovered = _storage_lines(deployment.serve_log())
    integrity = {name: _integrity(deployment.state / name) for name in STORES}
    faults = timeline.faults
    tracebacks = sum(1 for a in answers if a.traceback)
    tracebacks += deployment.serve_log().count("Traceback")
    figures: dict[str, Any] = {
        "proposals": n,
        "proposal events": work.counts.proposals,
        "approval decisions": work.counts.decisions,
        "disk used at most MiB": round(peak[0] / 2**20, 1),
        "faults": len(faults),
        "fault held s (each)": _each(f.back_at - f.filled_at for f in faults),
        "fault cost s, space back -> next call executed (each)": _each(f.cost_s for f in faults),
        "serve backlog at each fill (rows)": _each(f.backlog for f in faults),
        "fills tried": sum(f.fills for f in faults),
        "write-ahead logs cut before each fill (MiB)": _each(
            round(f.wal_bytes / 2**20, 1) for f in faults
        ),
        "requests refused (sdk), sent again": sum(len(f.refused) for f in faults),
        "appends refused (sdk)": sum(f.refused_appends for f in faults),
        "requests refused outside a fault": len(timeline.stray),
        "answers before the faults": _tally(before),
        "refusals during the faults, by surface": _by_surface(during),
        "other answers during the faults": _tally(a for a in during if a.code != STORAGE),
        "answers after the faults": _tally(after),
        "answers of unrecorded calls": len(unrecorded),
        "probe answers outside the vocabulary": sum(
            1 for a in answers if a.code not in {c.value for c in Code}
        ),
        "tracebacks": tracebacks,
        "serve: rounds refused, then resumed (each)": ", ".join(
            f"{r.get('attempts')} in {float(r.get('refused_s', 0)):.2f}s" for r in recovered
        ),
        "serve logged each refusal and recovery": len(refused_lines) >= len(faults)
        and len(recovered) >= len(faults),
        **verdict.figures,
        "executions reconciled after a refused follow-up": sum(
            1 for e in evidence.events if isinstance(e, ev.ExecutionReconciled)
        ),
        "files left half written": len(file_problems),
        "store integrity ok": all(v == "ok" for v in integrity.values()),
        "audit chain ok": audit_ok,
        "audit records": audit_records,
        "replay equal": replay_ok,
        "replayed events": replayed,
        "serve stopped cleanly": stopped == 0,
    }
    violations = [*verdict.violations, *(f"answer of a call not recorded: {u}" for u in unrecorded)]
    violations += [f"state file: {p}" for p in file_problems]
    violations += [f"{name}: integrity_check {v}" for name, v in integrity.items() if v != "ok"]
    for k, fault in enumerate(faults):
        violations += fault_violations(k, fault, [a for a in during if a.fault == k])
    if not any(f.refused for f in faults):
        violations.append("the store refused no request of the flows (the SDK's appends)")
    violations += [f"{name}: {figures[name]}" for name in ZERO if figures[name]]
    violations += [f"not so: {name}" for name in TRUE if not figures[name]]
    if not audit_ok:
        violations.append("callgate audit verify: not ok")
    if not replay_ok:
        violations.append("callgate replay: the rebuilt views differ from the live views")
    return {"figures": figures, "violations": violations, "seed": seed}


def unrecorded_answers(
    answers: Iterable[Answer], statuses: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Answers that are not ``storage_unavailable`` and name no call the log holds: a
    surface that told a caller anything else about a call it did not record."""
    return [
        f"{a.surface}: {a.code}"
        for a in answers
        if a.code != STORAGE and not statuses.get(a.invocation_id or "")
    ]


def fault_violations(k: int, fault: Fault, during: Sequence[Answer]) -> list[str]:
    """What one fault must have shown: it bit each surface, it ended, work resumed."""
    found: list[str] = []
    if not fault.back_at:
        found.append(f"fault {k + 1}: the disk was never filled while serve had work")
    if fault.back_at and fault.cost_s is None:
        found.append(f"fault {k + 1}: no call was executed after the space came back")
    for surface in SURFACES:
        if not any(a.surface == surface and a.code == STORAGE for a in during):
            found.append(f"fault {k + 1}: {surface} answered no storage_unavailable")
    return found


class _Driver:
    """The flows (at most ``WINDOW`` in flight), each advanced when its wait is answered,
    and the faults: fill, hold, give the space back, time the first execution after."""

    def __init__(
        self,
        gate: Gateway,
        work: Workload,
        outbox: _RefusingOutbox,
        timeline: Timeline,
        probes: Probes,
        ballast: small_disk.Ballast,
        out: Renderer,
        backlog: Callable[[], int],
    ) -> None:
        self.gate, self.work, self.outbox, self.timeline = gate, work, outbox, timeline
        self.probes, self.ballast, self.out, self.backlog = probes, ballast, out, backlog
        self.state = _state_dir(gate)
        self.on_full: Callable[[], None] = lambda: None

    def drive(self, n: int, hold_s: float, peak: list[int]) -> None:
        work, timeline = self.work, self.timeline
        active: dict[int, tuple[Script, Wait]] = {}
        launched = done = 0
        report = time.monotonic() + 5
        disk = self.ballast.path.parent
        while launched < n or active or not timeline.over:
            now = time.monotonic()
            while len(active) < WINDOW and launched < n:
                script = work.script(launched, pick_kind(work.rng, launched, n))
                active[launched] = (script, next(script))
                launched += 1
            self.outbox.flush()
            due = timeline.due(done / n)
            if due is not None:
                self._fill(due)
            time.sleep(0.03)
            for i, (script, wait) in list(active.items()):
                value = self.gate.backend.view(wait.view, wait.key)
                if value is not None and wait.ready(value):
                    self._time_recovery(value)
                    try:
                        active[i] = (script, script.send(value))
                    except StopIteration:
                        del active[i]
                        done += 1
                elif now - wait.since > STEP_TIMEOUT_S:
                    work.failures.append(f"flow {i}: no answer for {wait.view} {wait.key}")
                    script.close()
                    del active[i]
                    done += 1
            peak[0] = max(peak[0], _used(disk) - self.ballast.size)
            k = timeline.active()
            if k is not None:
                fault = timeline.faults[k]
                # Space serve frees meanwhile (a cut write-ahead log) is taken back at once, as
                # by another writer: a probe that finds room records its call, and the fault
                # must bite every surface before it ends (``fault_violations``).
                if small_disk.free_bytes(self.ballast.path.parent):
                    fault.ballast_bytes = self.ballast.fill()
                held = time.monotonic() - fault.filled_at
                if (
                    held >= hold_s
                    and self.probes.answered_all(k)
                    and (self.probes.refused_all(k) or held >= hold_s + BITE_WAIT_S)
                ):
                    self._give_back(fault)
            if now > report:
                report = now + 5
                _say(self.out, f"{done}/{n} flows done, {len(active)} in flight")
        self.outbox.flush(everything=True)

    def _fill(self, fault: Fault) -> None:
        """Fill the disk while ``serve`` has rows to handle, so that it meets the full disk
        too (a client's append is refused either way); a fill that finds it caught up is
        given back, and tried again at a later step."""
        if not self.backlog():
            return
        fault.fills += 1
        fault.wal_bytes = _truncate_wals(self.state)
        size = self.ballast.fill()
        fault.backlog = self.backlog()
        if not fault.backlog:
            self.ballast.release()
            return
        fault.ballast_bytes = size
        fault.filled_at = time.monotonic()
        self.on_full()
        _say(
            self.out, f"disk full ({size / 2**20:.0f} MiB of ballast, serve {fault.backlog} behind)"
        )

    def _give_back(self, fault: Fault) -> None:
        self.ballast.release()
        fault.back_at = time.monotonic()
        fault.back_epoch_ms = time.time_ns() // 1_000_000
        _say(self.out, f"space back after {fault.back_at - fault.filled_at:.1f}s")

    def _time_recovery(self, status: Mapping[str, Any]) -> None:
        """The first call executed after the space came back ends the last fault's cost."""
        ended = [f for f in self.timeline.faults if f.back_at]
        if not ended or ended[-1].cost_s is not None or status.get("outcome") != EXECUTED:
            return
        fault = ended[-1]
        at = int(status.get("updated_at") or 0)
        if at >= fault.back_epoch_ms:
            fault.cost_s = (at - fault.back_epoch_ms) / 1000


def _state_dir(gate: Gateway) -> Path:
    """The state directory of the store the SDK writes to."""
    backend = gate.backend
    assert isinstance(backend, EmbeddedBackend)
    return backend.store.state_dir


def _truncate_wals(state: Path) -> int:
    """Checkpoint both SQLite files and cut their write-ahead logs to nothing; returns the
    bytes the logs held. A log keeps the space it grew to and is written again from its
    start after a checkpoint: a disk that fills then refuses nothing until that space is
    used up. Cut first, every write that needs space meets the full disk at once."""
    held = 0
    for name in STORES:
        wal = state / f"{name}-wal"
        held += wal.stat().st_size if wal.exists() else 0
        conn = sqlite3.connect(state / name, timeout=5.0)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
    return held


def _backlog(gate: Gateway, app: App) -> Callable[[], int]:
    """How many rows of their inputs ``serve``'s processes have still to handle."""
    backend = gate.backend
    assert isinstance(backend, EmbeddedBackend)
    readers = [(p.name, tuple(p.inputs)) for p in app.processes()]
    return lambda: sum(backend.store.backlog(name, inputs) for name, inputs in readers)


def _settle(gate: Gateway, ids: set[str]) -> dict[str, dict[str, Any]]:
    """Wait until every call of ``ids`` has a settled status; their statuses."""
    deadline = time.monotonic() + STEP_TIMEOUT_S
    statuses: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        for inv in ids:
            if not statuses.get(inv, {}).get("settled"):
                statuses[inv] = gate.backend.view("status", inv) or {}
        if all(statuses[i].get("settled") for i in ids):
            break
        time.sleep(0.2)
    time.sleep(1.0)  # late changes, e.g. a reconciled original
    return {i: gate.backend.view("status", i) or statuses.get(i, {}) for i in ids}


def _command(deployment: Deployment, *command: str, ok: str, n: str) -> tuple[bool, int]:
    """``callgate --json COMMAND``: whether it exited 0 with ``ok`` true, and its count."""
    done = subprocess.run(
        deployment.argv("--json", *command), env=deployment.env(), capture_output=True, text=True
    )
    report = json.loads(done.stdout)
    return done.returncode == 0 and bool(report.get(ok)), int(report.get(n, 0))


def _operator(app: App) -> str:
    return app.session_issuer.issue("disk-operator", "disk", [OPERATOR_ROLE], app.clock())


def _storage_lines(log: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``serve``'s ``storage_unavailable`` and ``storage_recovered`` lines (its JSON log)."""
    lines = []
    for text in log.splitlines():
        with contextlib.suppress(ValueError):
            line = json.loads(text)
            if isinstance(line, dict):
                lines.append(line)
    refused = [x for x in lines if x.get("event") == "storage_unavailable"]
    return refused, [x for x in lines if x.get("event") == "storage_recovered"]


def _integrity(path: Path) -> str:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return "; ".join(str(row[0]) for row in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()


def _each(values: Iterable[float | int | None]) -> str:
    return ", ".join("-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)
                     for v in values)  # fmt: skip


def _tally(answers: Iterable[Answer]) -> dict[str, int]:
    return dict(sorted(Counter(f"{a.surface} {a.code}" for a in answers).items()))


def _by_surface(answers: Sequence[Answer]) -> dict[str, int]:
    counts = Counter(a.surface for a in answers if a.code == STORAGE)
    return {surface: counts[surface] for surface in SURFACES}


def _used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _say(out: Renderer, line: str) -> None:
    if not out.json_mode:
        out.err.print(f"[dim]disk-full: {line}[/]")
