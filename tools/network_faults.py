"""``python -m tools chaos --network``: callgate on Apache Kafka behind a network that
misbehaves (issue 42, "A network that misbehaves"; ADR 0088).

One run:

1. its own broker (``tools.apache_kafka``) with a second listener that advertises the
   address of a Toxiproxy proxy (``tools.toxiproxy``): the instances bootstrap at the
   proxy and the broker's metadata sends them back to it, so every connection of every
   worker passes through the proxy. The reference HTTP provider
   (``callgate.providers.reference_server``) serves ``crm.*`` tools behind a second proxy
   (the profile's ``crm`` provider points at the proxy, 2 s timeout). The run itself, in
   the role of the agents and the approval UIs, talks to the broker directly: the faults
   are between callgate and its broker and upstream, not between the agent and callgate;
2. ``--instances`` instances of ``serve``'s supervisor (``tools.chaos.Fleet``), started
   while the broker's proxy is disabled ("broker unreachable at start"); it is enabled
   ``hold`` seconds later;
3. the chaos run's flows (``tools.chaos.Workload``, 10% of inputs published twice,
   simulated providers that time out) plus keyed ``crm.create`` calls on the HTTP
   upstream, launched at a steady rate while the faults follow one another, each held
   for its time with a quiet gap between them: on the broker's proxy a latency of 200 ms
   with 100 ms of jitter, a bandwidth limit, a blackhole (every byte swallowed, the
   connections left open) and connection resets (TCP RST on every connection, new ones
   too); then the same four on the upstream's proxy. A call that ends
   ``outcome_uncertain`` is resubmitted under its key after a pause, until it settles;
4. during each fault one agent's call through the command line (``callgate propose
   --timeout 10`` with the instances' bootstrap, the proxy): it must answer a code of the
   vocabulary (an outcome, or ``timeout`` / ``broker_unavailable``) within its two bounded
   waits (the broker, then the answer) and 5 s for its own start, never hang;
5. the verdict of the chaos run (``tools.chaos.verify``: nothing lost, no effect applied
   twice, the upstream's effects included, no high-impact effect without its approval,
   every uncertain outcome reconciled, audit chain and replay equal) and, per fault, what
   it cost: flows done per second before and during it, the time from its end to the next
   flow done, and ``cost s`` = ``hold x (1 - rate during / rate before) + recovery``: the
   seconds of normal throughput the fault took.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from callgate.adapters.kafka.serve import create_topics
from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain.codes import Code
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.render import Renderer
from callgate.surfaces.sdk import Gateway
from tools import exit_on_signal
from tools.apache_kafka import ApacheKafka, KafkaUnavailable
from tools.chaos import (
    DONE,
    EXECUTED,
    FAULTS,
    REPLAYED,
    STEP_TIMEOUT_S,
    UNCERTAIN,
    VOCABULARY,
    WINDOW,
    Evidence,
    Fleet,
    Script,
    Step,
    Wait,
    Who,
    Workload,
    _consistent,
    _Outbox,
    _render,
    _settle,
    final_verdict,
    limited_profile,
    pick_kind,
)
from tools.ports import free_port
from tools.toxiproxy import Stream, Toxiproxy, ToxiproxyUnavailable

Kind = Literal["start", "latency", "bandwidth", "blackhole", "reset"]
KAFKA, UPSTREAM = "kafka", "upstream"
BOTH: tuple[Stream, ...] = ("upstream", "downstream")  # the proxy's two directions
LATENCY_MS, JITTER_MS = 200, 100
BANDWIDTH_KB_S = {KAFKA: 64, UPSTREAM: 4}  # KB/s each way: Kafka's fetches are larger
UPSTREAM_SHARE = 0.12  # of the flows: keyed crm.create on the HTTP upstream
UPSTREAM_TIMEOUT_S = 2.0  # the crm provider's timeout_s
RETRY_PAUSE_S = 2.0  # an agent's pause before it resubmits an uncertain call
RETRY_FOR_S = 180.0  # ... and for how long it keeps resubmitting
PROBE_TIMEOUT_S = 10  # the agent's ``--timeout``
# ``--timeout`` bounds each of the command's waits: for the broker (its publication), then
# for the answer; the allowance is its own start and stop on a loaded machine.
PROBE_ALLOWANCE_S = 5.0
PROBE_BOUND_S = 2 * PROBE_TIMEOUT_S + PROBE_ALLOWANCE_S
PROBE_AFTER_S = 1.0  # into the fault
RECOVERY_LIMIT_S = 90.0  # a fault's end to the next flow done
SLOW_S = 15.0  # per fault: what its recovery and a slow machine add to the schedule
SETTLE_S = 600.0  # past the schedule: the recoveries, the last flows, the audit and replay
# Figures that must be 0, or true, beside the chaos run's (``tools.chaos._render``).
ZERO = (
    "agent calls without a code in time",
    "flows done in a broker blackhole",
    "faults not recovered",
)


@dataclass(frozen=True)
class Plan:
    """One fault of the campaign: on which proxy, what, for how long."""

    label: str
    proxy: str
    kind: Kind
    hold_s: float


def campaign(hold_s: float, blackhole_s: float, short: bool = False) -> list[Plan]:
    """The faults in turn: the broker unreachable at start, then latency, bandwidth,
    blackhole and resets on the broker's proxy and then on the upstream's. ``short`` (the
    test tier): the start, the broker's latency, blackhole and resets, the upstream's
    blackhole and resets."""
    plans = [Plan("broker unreachable at start", KAFKA, "start", hold_s)]
    for proxy, name in ((KAFKA, "broker"), (UPSTREAM, "upstream")):
        plans += [
            Plan(f"{name}: latency {LATENCY_MS}±{JITTER_MS} ms", proxy, "latency", hold_s),
            Plan(
                f"{name}: bandwidth {BANDWIDTH_KB_S[proxy]} KB/s",
                proxy,
                "bandwidth",
                hold_s,
            ),
            Plan(f"{name}: blackhole {blackhole_s:g} s", proxy, "blackhole", blackhole_s),
            Plan(f"{name}: connection resets", proxy, "reset", min(hold_s, 10.0)),
        ]
    if short:
        keep = {"start", "blackhole", "reset"}
        plans = [p for p in plans if p.kind in keep or (p.proxy == KAFKA and p.kind == "latency")]
    return plans


@dataclass
class Probe:
    """One agent's call during a fault: its code and how long it took."""

    tool: str
    code: str = ""
    seconds: float = 0.0
    detail: str = ""

    @property
    def ok(self) -> bool:
        coded = self.code in VOCABULARY
        return coded and self.seconds <= PROBE_BOUND_S


@dataclass
class Fault:
    plan: Plan
    started: float = 0.0
    ended: float = 0.0
    rate_before: float = 0.0
    rate_during: float = 0.0
    done_in_blackhole: int = 0
    recovery_s: float | None = None
    probe: Probe | None = None
    thread: threading.Thread | None = None

    @property
    def cost_s(self) -> float | None:
        if self.recovery_s is None:
            return None
        hold = self.ended - self.started
        if not self.rate_before:  # nothing ran before it (the start): all of it was lost
            return hold + self.recovery_s
        return hold * max(0.0, 1.0 - self.rate_during / self.rate_before) + self.recovery_s


class Network:
    """The two proxies and what each fault does to them."""

    def __init__(self, proxy: Toxiproxy) -> None:
        self.proxy = proxy

    def apply(self, plan: Plan) -> None:
        p, name = self.proxy, plan.proxy
        if plan.kind == "start":
            p.enable(name, False)
        elif plan.kind == "latency":
            p.toxic(name, "latency", "downstream", latency=LATENCY_MS, jitter=JITTER_MS)
        elif plan.kind == "bandwidth":
            for stream in BOTH:
                p.toxic(name, "bandwidth", stream, rate=BANDWIDTH_KB_S[name])
        elif plan.kind == "blackhole":
            for stream in BOTH:
                p.toxic(name, "timeout", stream, timeout=0)
        else:
            p.toxic(name, "reset_peer", "downstream", timeout=0)

    def lift(self, plan: Plan) -> None:
        self.proxy.clear(plan.proxy)


class NetWorkload(Workload):
    """The chaos flows, keyed ``crm.create`` calls on the HTTP upstream, and agents that
    pause before they resubmit an uncertain call and keep at it for ``RETRY_FOR_S`` (a
    blackholed upstream leaves calls uncertain for as long as it lasts)."""

    def run(
        self,
        flow: int,
        who: Who,
        tool: str,
        args: Mapping[str, Any],
        key: str | None,
        approval_id: str | None = None,
        also: frozenset[str] = frozenset(),
    ) -> Step:
        first = {EXECUTED, UNCERTAIN} | also
        status = yield from self.propose(flow, who, tool, args, first, key, approval_id)
        until = time.monotonic() + RETRY_FOR_S
        while status["outcome"] == UNCERTAIN and time.monotonic() < until:
            now = time.monotonic()
            yield Wait("status", str(status["invocation_id"]), now, after=now + RETRY_PAUSE_S)
            self.counts.retries += 1
            expect = {EXECUTED, REPLAYED, UNCERTAIN} | also
            status = yield from self.propose(flow, who, tool, args, expect, key, approval_id)
        return status

    def script(self, i: int, kind: str) -> Script:
        if kind != UPSTREAM:
            yield from super().script(i, kind)
            return
        args = {"name": f"contact {i}"}
        s = yield from self.run(i, self.alice, "crm.create", args, f"crm-{i}")
        self.want(i, s, DONE)


def pick(rng: random.Random, i: int, flows: int) -> str:
    kind = pick_kind(rng, i, flows)
    return UPSTREAM if kind != "budget" and rng.random() < UPSTREAM_SHARE else kind


def network_profile(state: Path, flows: int, upstream_url: str) -> Path:
    """The chaos run's profile (its usage limit) with ``crm.read`` and ``crm.create`` on
    the reference HTTP provider behind the upstream's proxy."""
    path = limited_profile(state, flows)
    raw = yaml.safe_load(path.read_text())
    raw["providers"]["crm"] = {
        "kind": "http",
        "base_url": upstream_url,
        "timeout_s": UPSTREAM_TIMEOUT_S,
        "retries": 1,
    }
    common: dict[str, Any] = {"provider": "crm", "callers": ["support"], "impact": "low"}
    contact = {"type": "string", "minLength": 1, "maxLength": 64}
    raw["tools"]["crm.read"] = {
        **common, "mutation": False, "require_dry_run": False, "confirmation": "none",
        "target_arg": "contact_id",
        "args_schema": {"type": "object", "required": ["contact_id"],
                        "properties": {"contact_id": contact}, "additionalProperties": False},
    }  # fmt: skip
    raw["tools"]["crm.create"] = {
        **common, "require_dry_run": False, "confirmation": "none", "target_arg": None,
        "args_schema": {"type": "object", "required": ["name"],
                        "properties": {"name": {"type": "string"}}, "additionalProperties": False},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class Upstream:
    """The reference HTTP provider on a free loopback port (in memory)."""

    def __init__(self, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("ab")
        argv = [sys.executable, "-m", "callgate.providers.reference_server"]
        self.proc = subprocess.Popen(
            [*argv, "--port", str(self.port)], stdout=self._log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                self.control("GET", "health")
                return
            except OSError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the reference provider did not start: {log}") from exc
                time.sleep(0.1)

    def control(self, method: str, what: str, body: Mapping[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(dict(body)).encode()
        request = urllib.request.Request(
            f"{self.url}/_control/{what}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def effects(self) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """Its effects in the chaos ledger's shape, and the execute requests per token."""
        found = self.control("GET", "effects")
        effects = [
            {
                "seq": 10_000_000 + n,
                "provider": "crm",
                "tool": x["tool"],
                "target": x["target"],
                "tenant": x["tenant"],
                "token": x["token"],
                "invocation_id": x["invocation_id"],
                "args": {k: v for k, v in x["result"].items() if k not in ("id", "created")},
            }
            for n, x in enumerate(found["effects"])
        ]
        return effects, dict(found["execute_requests"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


@dataclass
class Agent:
    """An agent's call through the command line, with the instances' bootstrap (the
    broker's proxy): what an agent on this deployment would run."""

    state: Path
    profile: Path
    bootstrap: str
    prefix: str
    token: str

    def call(self, tool: str, args: Mapping[str, Any]) -> Probe:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
        env |= {"CALLGATE_DEV": "1", "CALLGATE_TOPIC_PREFIX": self.prefix, "COLUMNS": "200"}
        callgate = str(Path(sys.executable).with_name("callgate"))
        argv = [callgate, "--state-dir", str(self.state), "--profile", str(self.profile),
                "--backend", "kafka", "--bootstrap-servers", self.bootstrap, "--json",
                "--timeout", str(PROBE_TIMEOUT_S), "propose", "--session", self.token,
                "--tool", tool, "--args", json.dumps(dict(args))]  # fmt: skip
        probe = Probe(tool)
        began = time.monotonic()
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            probe.seconds, probe.code = time.monotonic() - began, "hung (killed after 120 s)"
            return probe
        probe.seconds = time.monotonic() - began
        try:
            body = json.loads(done.stdout)
            error = body.get("error") if isinstance(body.get("error"), dict) else {}
            probe.code = str(body.get("outcome") or (error or {}).get("code") or "")
            probe.detail = str((error or {}).get("message", ""))[:120]
        except (json.JSONDecodeError, AttributeError):
            probe.code = f"unreadable: {done.stdout[-200:]!r} {done.stderr[-300:]!r}"
        return probe


@dataclass
class _Progress:
    launched: int = 0
    done_at: list[float] = field(default_factory=list)
    timed_out: bool = False

    def done_between(self, a: float, b: float) -> int:
        return sum(1 for t in self.done_at if a <= t < b)


class _Driver:
    """Launches flows at a steady rate while the faults follow one another, and times them."""

    def __init__(
        self,
        gate: Gateway,
        fleet: Fleet,
        work: NetWorkload,
        outbox: _Outbox,
        network: Network,
        agent: Agent,
        out: Renderer,
        rate: float,
        flows: int,
        gap_s: float,
        deadline: float,
    ) -> None:
        self.gate, self.fleet, self.work, self.outbox = gate, fleet, work, outbox
        self.network, self.agent, self.out = network, agent, out
        self.rate, self.flows, self.gap_s, self.deadline = rate, flows, gap_s, deadline
        self.p = _Progress()
        self.active: dict[int, tuple[Script, Wait]] = {}
        self._report = time.monotonic() + 10.0

    def step(self, launching: bool, began: float) -> None:
        now = time.monotonic()
        if now > self.deadline:
            self.p.timed_out = True
            return
        self.fleet.check()
        due = int((now - began) * self.rate) if launching else self.p.launched
        due = min(due, self.flows)
        while len(self.active) < WINDOW and self.p.launched < due:
            i = self.p.launched
            script = self.work.script(i, pick(self.work.rng, i, self.flows))
            self.active[i] = (script, next(script))
            self.p.launched += 1
        self.outbox.flush()
        self.gate.backend.wait(lambda: False, 0.03)
        for i, (script, wait) in list(self.active.items()):
            value = self.gate.backend.view(wait.view, wait.key)
            if value is not None and wait.ready(value):
                try:
                    self.active[i] = (script, script.send(value))
                except StopIteration:
                    del self.active[i]
                    self.p.done_at.append(time.monotonic())
            elif now - wait.since > STEP_TIMEOUT_S:
                self.work.failures.append(f"flow {i}: no answer for {wait.view} {wait.key}")
                script.close()
                del self.active[i]
                self.p.done_at.append(time.monotonic())
        if now > self._report:
            self._report = now + 10.0
            oldest = min(self.active.values(), key=lambda a: a[1].since, default=None)
            waits = (
                f"; oldest waits {now - oldest[1].since:.0f} s for {oldest[1].view} {oldest[1].key}"
                if oldest
                else ""
            )
            self._say(
                f"network: {len(self.p.done_at)}/{self.p.launched} flows done, "
                f"{len(self.active)} in flight{waits}",
                dim=True,
            )

    def run_for(self, seconds: float, began: float, launching: bool = True) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until and not self.p.timed_out:
            self.step(launching, began)

    def fault(self, fault: Fault, began: float) -> None:
        """Hold one fault (already applied for the start) with the flows going on and one
        agent's call during it; lift it and time the recovery."""
        plan = fault.plan
        if plan.kind != "start":
            self.network.apply(plan)
        fault.started = time.monotonic()
        self._say(f"network: {plan.label} for {plan.hold_s:g} s")
        tool, args = (
            ("crm.read", {"contact_id": "C-probe"})
            if plan.proxy == UPSTREAM
            else ("tickets.read", {"ticket_id": "T-probe"})
        )
        fault.probe = Probe(tool)

        def call() -> None:
            time.sleep(PROBE_AFTER_S)
            result = self.agent.call(tool, args)
            assert fault.probe is not None
            fault.probe.code, fault.probe.seconds = result.code, result.seconds
            fault.probe.detail = result.detail

        fault.thread = threading.Thread(target=call, name=f"probe {plan.label}", daemon=True)
        fault.thread.start()
        self.run_for(plan.hold_s, began)
        self.network.lift(plan)
        fault.ended = time.monotonic()
        if plan.proxy == KAFKA and plan.kind == "blackhole":
            fault.done_in_blackhole = self.p.done_between(fault.started + 2.0, fault.ended)
        mark = len(self.p.done_at)
        while not self.p.timed_out and time.monotonic() - fault.ended < RECOVERY_LIMIT_S:
            if len(self.p.done_at) > mark:
                fault.recovery_s = self.p.done_at[mark] - fault.ended
                break
            due = min(self.flows, int((time.monotonic() - began) * self.rate))
            if not self.active and self.p.launched >= due:
                fault.recovery_s = 0.0  # nothing in flight: nothing waited
                break
            self.step(True, began)
        fault.rate_during = self.p.done_between(fault.started, fault.ended) / max(
            1e-6, fault.ended - fault.started
        )
        fault.thread.join(timeout=PROBE_TIMEOUT_S + 120)
        cost = fault.cost_s
        self._say(
            f"network: {plan.label} lifted; recovery "
            f"{'none' if fault.recovery_s is None else f'{fault.recovery_s:.1f} s'}, cost "
            f"{'n/a' if cost is None else f'{cost:.1f} s'}, agent's call "
            f"{fault.probe.code} in {fault.probe.seconds:.1f} s"
        )

    def drive(self, faults: list[Fault]) -> None:
        began = time.monotonic()
        first = faults[0]
        if first.plan.kind == "start":  # the instances start with the broker unreachable
            self.fault(first, began)
            faults = faults[1:]
            self.run_for(self.gap_s, began)
        else:
            self.run_for(self.gap_s, began)
        for fault in faults:
            now = time.monotonic()
            fault.rate_before = self.p.done_between(now - self.gap_s, now) / self.gap_s
            self.fault(fault, began)
            self.run_for(self.gap_s, began)
        self.outbox.flush(everything=True)
        while self.active and not self.p.timed_out:  # the flows in flight finish
            self.step(False, began)
        if self.p.timed_out:
            waiting = [f"flow {i}: still waiting at the time limit" for i in self.active]
            self.work.failures += waiting

    def _say(self, line: str, dim: bool = False) -> None:
        if not self.out.json_mode:
            self.out.err.print(f"[dim]{line}[/]" if dim else f"[magenta]{line}[/]")


def run_network(
    settings: Settings,
    out: Renderer,
    *,
    instances: int = 2,
    seed: int = 7,
    rate: float = 12.0,
    hold_s: float = 30.0,
    blackhole_s: float = 30.0,
    gap_s: float = 10.0,
    short: bool = False,
) -> int:
    """The network campaign (module docstring); 0 when every check holds, else 1."""
    if settings.bootstrap_servers:
        out.error(Code.USAGE, "--network starts the run's own broker: no --bootstrap-servers")
        return 2
    plans = campaign(hold_s, blackhole_s, short)
    schedule_s = sum(p.hold_s for p in plans) + gap_s * len(plans)
    # The flows launched at most: the usage limit is set from it, so alice's creations (a
    # fifth of the flows) stay below it while lena's bursts pass it (tools.chaos).
    flows = int(rate * (schedule_s + SLOW_S * len(plans))) + 1
    limit = schedule_s + SETTLE_S
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, exit_on_signal)  # stop what it started, even then
    state = Path(tempfile.mkdtemp(prefix="callgate-network-"))
    proxy: Toxiproxy | None = None
    broker: ApacheKafka | None = None
    upstream: Upstream | None = None
    ok = False
    try:
        try:
            proxy = Toxiproxy().start()
            kafka_port = free_port()
            broker = ApacheKafka(advertise_external=f"127.0.0.1:{kafka_port}").start()
        except (ToxiproxyUnavailable, KafkaUnavailable) as exc:
            out.error(Code.BROKER_UNAVAILABLE, f"chaos --network: {exc}")
            return 1
        proxy.proxy(KAFKA, f"127.0.0.1:{broker.external_port}", port=kafka_port, enabled=False)
        (state / "logs").mkdir(parents=True)
        upstream = Upstream(state / "logs" / "upstream.log")
        upstream_port = proxy.proxy(UPSTREAM, f"127.0.0.1:{upstream.port}")
        upstream.control("POST", "resources", {"id": "C-probe", "tenant": "acme"})
        prefix = f"network-{uuid.uuid4().hex[:8]}"
        run = settings.model_copy(
            update={
                "state_dir": state,
                "backend": "kafka",
                "bootstrap_servers": broker.bootstrap,  # the run's own client: direct
                "topic_prefix": prefix,
                "faults": {**FAULTS, "seed": seed},
                "profile": network_profile(state, flows, f"http://127.0.0.1:{upstream_port}"),
                "dev": True,
            }
        )
        app = bootstrap(run)
        behind = app.settings.model_copy(update={"bootstrap_servers": f"127.0.0.1:{kafka_port}"})
        report = _campaign(app, bootstrap(behind), out, plans, Network(proxy), upstream, rate,
                           flows, gap_s, seed, instances, started, limit)  # fmt: skip
        report["state_dir"] = str(state)
        ok = not report["violations"]
        _render(out, report, ok, name="chaos --network", zero=ZERO)
        return 0 if ok else 1
    finally:
        if upstream is not None:
            upstream.stop()
        if broker is not None:
            broker.stop()
        if proxy is not None:
            proxy.stop()
        signal.signal(signal.SIGTERM, previous)
        if ok:
            shutil.rmtree(state, ignore_errors=True)
        else:
            out.err.print(f"[yellow]chaos --network: state and worker logs kept in {state}[/]")


def _campaign(
    app: App,
    behind: App,
    out: Renderer,
    plans: list[Plan],
    network: Network,
    upstream: Upstream,
    rate: float,
    flows: int,
    gap_s: float,
    seed: int,
    instances: int,
    started: float,
    limit: float,
) -> dict[str, Any]:
    rng = random.Random(seed)
    app.keys  # noqa: B018  (key material exists before the workers start, so all share it)
    create_topics(app)
    faults = [Fault(p) for p in plans]
    fleet = Fleet(behind, instances)  # every client of theirs goes through the proxy
    fleet.start()
    gate = Gateway(app, app.kafka_backend())
    outbox = _Outbox(gate.backend.publish, rng)
    work = NetWorkload(app, rng, outbox.send)
    agent = Agent(app.settings.state_dir, Path(str(app.settings.profile)),
                  str(behind.settings.bootstrap_servers), app.settings.topic_prefix,
                  work.alice.token)  # fmt: skip
    driver = _Driver(gate, fleet, work, outbox, network, agent, out, rate, flows, gap_s,
                     started + limit)  # fmt: skip
    try:
        driver.drive(faults)
        deadline = started + limit
        settled = _settle(gate, work, fleet, out, deadline)
        verified, replayed = _consistent(gate, fleet, deadline)
        upstream_effects, requests = upstream.effects()
        evidence = Evidence(
            calls=work.calls,
            statuses=settled,
            effects=[*gate.effects(), *upstream_effects],
            audit=gate.audit(
                session=app.session_issuer.issue(
                    "network-operator", "network", [OPERATOR_ROLE], app.clock()
                )
            ),
            events=list(gate.backend.read_events()),
            flow_failures=work.failures,
        )
    finally:
        gate.close()
        fleet.stop()
    verdict = final_verdict(evidence, app, verified, replayed)
    elapsed = time.monotonic() - started
    late = [f for f in faults if f.probe is None or not f.probe.ok]
    verdict.violations += [
        f"{f.plan.label}: the agent's call answered {f.probe and f.probe.code!r} in "
        f"{f.probe and round(f.probe.seconds, 1)} s (bound: {PROBE_BOUND_S:g} s)"
        for f in late
    ]
    blackholes = sum(f.done_in_blackhole for f in faults)
    if blackholes:
        verdict.violations.append(f"{blackholes} flows done in a broker blackhole: a bypass?")
    unrecovered = [f for f in faults if f.recovery_s is None]
    verdict.violations += [
        f"{f.plan.label}: no flow done within {RECOVERY_LIMIT_S:g} s of its end"
        for f in unrecovered
    ]
    if driver.p.timed_out or elapsed > limit:
        verdict.violations.append(f"time limit exceeded: {elapsed:.0f}s > {limit:.0f}s")
    upstream_calls = sum(1 for c in work.calls.values() if c.tool == "crm.create")
    figures: dict[str, Any] = {
        "proposals": driver.p.launched,
        "proposal events": work.counts.proposals,
        "approval decisions": work.counts.decisions,
        "instances": instances,
        "rate (flows/s)": rate,
        "duplicates injected": outbox.duplicates,
        "resubmissions after uncertain": work.counts.retries,
        "upstream calls (crm.create proposals)": upstream_calls,
        "upstream effects": len(upstream_effects),
        "upstream execute requests, most for one token": max(requests.values(), default=0),
        **{f"fault: {f.plan.label}": _fault_line(f) for f in faults},
        "agent calls without a code in time": len(late),
        "flows done in a broker blackhole": blackholes,
        "faults not recovered": len(unrecovered),
        "worker stalls": sum(sum(s.stalls.values()) for s in fleet.sups),
        "restarts": fleet.restarts,
        **verdict.figures,
        "audit chain ok": verified.ok,
        "audit records": verified.records,
        "replay equal": bool(replayed["equal"]),
        "replayed events": replayed["events"],
        "elapsed s": round(elapsed, 1),
        "time limit s": round(limit),
    }
    return {
        "figures": figures,
        "faults": [_fault_row(f) for f in faults],
        "violations": verdict.violations,
        "seed": seed,
    }


def _fault_row(f: Fault) -> dict[str, Any]:
    cost = f.cost_s
    return {
        "fault": f.plan.label,
        "held s": round(f.ended - f.started, 1),
        "flows/s before": round(f.rate_before, 1),
        "flows/s during": round(f.rate_during, 1),
        "recovery s": None if f.recovery_s is None else round(f.recovery_s, 1),
        "cost s": None if cost is None else round(cost, 1),
        "agent call": f.probe.code if f.probe else None,
        "agent call s": round(f.probe.seconds, 1) if f.probe else None,
    }


def _fault_line(f: Fault) -> str:
    row = _fault_row(f)
    return (
        f"held {row['held s']} s, {row['flows/s before']} -> {row['flows/s during']} flows/s, "
        f"recovery {row['recovery s']} s, cost {row['cost s']} s; agent: "
        f"{row['agent call']} in {row['agent call s']} s"
    )
