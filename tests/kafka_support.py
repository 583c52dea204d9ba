"""Shared helpers for the tests of the whole service on the Kafka backend.

``KafkaServe`` runs the installed ``callgate serve --backend kafka`` as a subprocess (the
supervisor that spawns one ``python -m callgate.surfaces.kafka_worker <process>`` child per
process) under a topic prefix of its own, so that test modules share one broker but no
topics, consumer groups or transactional ids. ``wait_ready`` drives one call through every
process (decider, executor and the four projections) before a test starts. ``cli`` runs
the installed command against a deployment; ``lifecycle_scenario``, ``v1_scenario`` and
``v2_scenario`` are run on the suite's broker. ``run_with_own_broker`` runs the
commands that start a broker of their own (``bench``, ``chaos``).

Group settings: serve hands its children ``session.timeout.ms=6000`` and a 500 ms heartbeat
through ``CALLGATE_KAFKA_CONSUMER``: the failover bounds of ADR 0015 (a lost member is
noticed within ``session.timeout.ms``), short enough for kill tests.

Broker: Apache Kafka, one per test session (per xdist worker), ``tests/conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pytest
from confluent_kafka import Consumer, TopicPartition
from tools.apache_kafka import CACHE_ENV, JAVA_ENV
from tools.toxiproxy import BINARY_ENV as TOXIPROXY_ENV
from tools.toxiproxy import CACHE_ENV as TOXIPROXY_CACHE_ENV

from callgate.adapters.avro_codec import AvroCodec, MalformedEvent
from callgate.adapters.kafka.client import Record, partition_for, read_partitions_to_end
from callgate.adapters.kafka.topics import Topics
from callgate.adapters.view_codec import ViewCodec
from callgate.bootstrap import Settings
from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.sdk import Gateway, connect
from tests.e2e.helpers import REPO, Run, callgate_argv, checked_answer, cli_env, propose_argv

PARTITIONS = 3  # few partitions keep joins and restores short; >1 exercises co-partitioning
GROUP_SESSION_S = 6.0  # a member that stops heartbeating is out of its group after this
FAST_GROUPS = f"session.timeout.ms={GROUP_SESSION_S * 1000:.0f},heartbeat.interval.ms=500"
CODEC = AvroCodec.default()
VIEWS = ViewCodec.default()
WORKER_MODULE = "callgate.surfaces.kafka_worker"
# A serve log line reporting a settled call (``--report-settled``): time, invocation, tool, code.
SETTLED_LINE = re.compile(r"^\S+Z [0-9a-f]{32}\.[0-9a-f]{32}  \S+  \S+$")
WORKER_NAMES = (
    "invocations", "status-projection", "pending-projection", "audit-projection",
    "decisions-projection",
)  # fmt: skip


REQUIRE_APACHE_ENV = "CALLGATE_REQUIRE_APACHE_KAFKA"  # "1": Apache Kafka must start


@dataclass(frozen=True)
class Broker:
    """The test broker (Apache Kafka, the reference broker: ADR 0024) and its address."""

    kind: str  # "apache"
    bootstrap: str


def require_broker() -> None:
    """Skip, printing why, where Apache Kafka cannot start here (no Java 17, no jars); fail
    instead when ``CALLGATE_REQUIRE_APACHE_KAFKA=1`` (``make test-kafka``, CI)."""
    from tools.apache_kafka import unavailable

    reason = unavailable()
    if reason is None:
        return
    message = f"kafka tests skipped: {reason}"
    print(message, file=sys.stderr)
    if os.environ.get(REQUIRE_APACHE_ENV) == "1":
        pytest.fail(f"{REQUIRE_APACHE_ENV}=1 but Apache Kafka cannot start: {reason}")
    pytest.skip(message)


def run_tool(state_dir: Path, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m tools --json --state-dir D ARGS`` (``bench``, ``chaos``) of the Python
    running the tests, with no ``CALLGATE_*`` setting of this process but where Java and
    the Apache Kafka jars are."""
    argv = [sys.executable, "-m", "tools", "--json", "--state-dir", str(state_dir)]
    # where the Apache Kafka jars, Java and Toxiproxy are: not settings
    keep = {CACHE_ENV, JAVA_ENV, TOXIPROXY_ENV, TOXIPROXY_CACHE_ENV}
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_") or k in keep}
    paths = [REPO / "services", REPO / "projections", REPO]
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


def run_with_own_broker(
    state_dir: Path, *args: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``run_tool`` for the tools that start a broker of their own (``bench``, ``chaos``);
    skips, as the suite's broker fixture does, only where that broker cannot start."""
    require_broker()
    return run_tool(state_dir, *args, timeout=timeout)


# What librdkafka's own log lines look like when they reach stderr (``%3|1700000000.123|FAIL|``
# from its default logger, or a Python log record naming it).
LIBRDKAFKA_MARKS = ("%3|", "%4|", "%5|", "%6|", "%7|", "rdkafka")


def librdkafka_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that come from librdkafka (none may, unless ``-v``)."""
    return [line for line in stderr.splitlines() if any(m in line for m in LIBRDKAFKA_MARKS)]


def unique_prefix(label: str) -> str:
    """A topic prefix no other test uses (topics, groups and transactional ids hang off it)."""
    return f"t-{label}-{uuid.uuid4().hex[:8]}"


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The offsets ``group`` has committed on ``topic``, per partition (negative: none).

    Read uncommitted: a read_committed consumer asks for stable offsets, which Apache Kafka
    withholds (``UNSTABLE_OFFSET_COMMIT``, retried by librdkafka until the timeout) while a
    killed runner's transaction with offsets in it is still open; the offsets committed so
    far are what the tests compare.
    """
    config = {"bootstrap.servers": bootstrap, "group.id": group}
    consumer = Consumer({**config, "isolation.level": "read_uncommitted"})
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
    finally:
        consumer.close()


def wait_for(
    predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


@dataclass(frozen=True)
class Deployment:
    """Where a Kafka deployment lives: broker, topic prefix, state dir, profile."""

    bootstrap: str
    prefix: str
    state_dir: Path
    profile: Path | None = None
    dev: bool = True  # development mode: the tests mint development session tokens
    config: Path | None = None  # a callgate.toml for serve and every client

    @property
    def topics(self) -> Topics:
        return Topics(self.prefix, PARTITIONS)

    def env(self) -> dict[str, str]:
        """The ``CALLGATE_*`` environment of serve and of every CLI client."""
        env = {
            "CALLGATE_BACKEND": "kafka",
            "CALLGATE_BOOTSTRAP_SERVERS": self.bootstrap,
            "CALLGATE_STATE_DIR": str(self.state_dir),
            "CALLGATE_TOPIC_PREFIX": self.prefix,
            "CALLGATE_PARTITIONS": str(PARTITIONS),
            "CALLGATE_KAFKA_CONSUMER": FAST_GROUPS,
            "CALLGATE_DEV": "1" if self.dev else "0",
        }
        if self.profile is not None:
            env["CALLGATE_PROFILE"] = str(self.profile)
        if self.config is not None:
            env["CALLGATE_CONFIG"] = str(self.config)
        return env

    def settings(self) -> Settings:
        fields: dict[str, Any] = {
            "backend": "kafka",
            "bootstrap_servers": self.bootstrap,
            "topic_prefix": self.prefix,
            "partitions": PARTITIONS,
            "state_dir": self.state_dir,
            "profile": self.profile,
            "dev": self.dev,
        }
        if self.config is not None:
            return Settings.from_env(config_file=self.config, environ={}, **fields)
        return Settings(**fields)

    def connect(self) -> Gateway:
        """The Python SDK on this deployment (its own client: ``close`` it)."""
        return connect(self.settings())

    # -- reading the log, as compliance would ------------------------------------------------

    def records(self, logical: str) -> list[Record]:
        """Every record of a logical topic, ``read_committed``: records of aborted transactions are
        hidden."""
        return read_partitions_to_end(self.bootstrap, self.topics.physical(logical), timeout_s=60)

    def events(self, logical: str = "events") -> list[tuple[Record, ev.Event]]:
        """Decoded records of a topic, in offset order per partition (undecodable skipped)."""
        out: list[tuple[Record, ev.Event]] = []
        for record in self.records(logical):
            try:
                out.append((record, CODEC.decode(record.value or b"")))
            except MalformedEvent:
                continue
        return out

    def readable_ends(self) -> str:
        """The last offset per partition of ``requests`` and ``events`` that a
        ``read_committed`` reader reaches, against a ``read_uncommitted`` one: a transaction
        left open holds every ``read_committed`` reader at its first record."""
        ends: dict[str, dict[int, int]] = {}
        for logical in ("requests", "events"):
            for isolation in ("read_committed", "read_uncommitted"):
                last: dict[int, int] = {}
                try:
                    records = read_partitions_to_end(
                        self.bootstrap, self.topics.physical(logical), isolation=isolation,
                        timeout_s=20,
                    )  # fmt: skip
                except TimeoutError as exc:
                    return f"{logical} {isolation}: {exc}"
                for record in records:
                    last[record.partition] = record.offset
                ends[f"{logical} {isolation}"] = dict(sorted(last.items()))
        return f"last offsets: {ends}"

    def event_types(self, invocation_id: str) -> list[str]:
        """The types of the ``events`` records of one invocation, in log order."""
        return [e.event_type for _, e in self.events() if e.invocation_id == invocation_id]


# --- callgate serve ----------------------------------------------------------------------------


class KafkaServe:
    """``callgate serve`` on Kafka as a subprocess; stderr goes to a log file."""

    def __init__(
        self,
        dep: Deployment,
        log: Path,
        flags: bool = False,
        instance_id: str = "i0",
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        """``flags``: the global options as flags (``--backend kafka --bootstrap-servers B
        --state-dir D --profile P``) instead of ``CALLGATE_*`` variables. ``instance_id``:
        ``serve --instance-id`` (instances of one deployment share the partitions)."""
        self.dep = dep
        self.log = log
        self.instance_id = instance_id
        self._stderr: TextIO = log.open("w")
        argv, env = [*callgate_argv()], dep.env()
        if flags:
            argv += ["--backend", "kafka", "--bootstrap-servers", dep.bootstrap]
            argv += ["--state-dir", str(dep.state_dir)]
            if dep.profile is not None:
                argv += ["--profile", str(dep.profile)]
            for name in ("BACKEND", "BOOTSTRAP_SERVERS", "STATE_DIR", "PROFILE"):
                env.pop(f"CALLGATE_{name}", None)
        argv += ["serve", "--instance-id", instance_id]
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env={**cli_env(), **env, **(extra_env or {})},
            cwd=REPO,
        )

    def wait_started(self, timeout_s: float = 60.0) -> None:
        """Until serve has created its topics and started its children (no probe call)."""
        deadline = time.monotonic() + timeout_s
        while "callgate serve" not in self.log.read_text():
            assert self.proc.poll() is None, f"serve exited early: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"serve not up: {self.log.read_text()}"
            time.sleep(0.05)

    def wait_ready(
        self, timeout_s: float = 120.0, probe: str | None = None, reader: str | None = None
    ) -> None:
        """Until every process has joined its group and handles input: a refund reaches
        ``approval_required`` (decider, executor's dry-run, status), shows in the pending
        view and the audit (pending, audit projections), and a denial of it is answered
        (decisions projection). Leaves no pending approval and no side effect behind.
        ``probe``, ``reader``: session tokens of the probing support user and of an operator
        (default: development tokens, for a deployment in development mode)."""
        deadline = time.monotonic() + timeout_s
        while "callgate serve" not in self.log.read_text():
            assert self.proc.poll() is None, f"serve exited early: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"serve not up: {self.log.read_text()}"
            time.sleep(0.05)
        gate = self.dep.connect()
        try:
            token = probe or gate.app.session_issuer.issue(
                "probe", "acme", ["support"], gate.app.clock()
            )
            refund = {"order_id": "ORD-READY", "amount_cents": 100, "currency": "EUR"}
            left = max(1.0, deadline - time.monotonic())
            probe = f"ready-probe-{uuid.uuid4().hex[:8]}"  # one per serve: instances share keys
            answer = gate.propose(token, "refunds.issue", refund, probe, timeout_s=left)
            assert answer["outcome"] == "approval_required", (answer, self.log.read_text())
            inv = answer["invocation_id"]
            gate.backend.wait(lambda: gate.backend.view("pending", inv) is not None, 30)
            ops = reader or operator(gate)
            gate.backend.wait(lambda: bool(gate.audit(inv, session=ops)), 30)
            gate.deny(inv, token, "readiness probe", timeout_s=30)
            assert gate.backend.wait(lambda: gate.backend.view("pending", inv) is None, 30)
        finally:
            gate.close()

    # -- the children -------------------------------------------------------------------------

    def worker_pid(self, process: str) -> int | None:
        """The pid of this serve's live child running ``process`` (from /proc)."""
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # exited meanwhile
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            state = stat.rsplit(")", 1)[1].split()[0]
            if ppid != self.proc.pid or state == "Z":
                continue
            words = [w.decode(errors="replace") for w in argv]
            if WORKER_MODULE in words and process in words:
                return int(entry.name)
        return None

    def worker_pids(self) -> list[int]:
        """The pids of every live child of this serve."""
        return [pid for name in WORKER_NAMES if (pid := self.worker_pid(name)) is not None]

    def diagnosis(self, logs: Sequence[Path]) -> str:
        """Why calls may not settle: the children alive now, every line of ``logs`` (this
        deployment's serve logs) that is not a settled call, each group's committed
        positions on ``requests`` and ``events``, and how far ``read_committed`` reaches."""
        alive = {name: self.worker_pid(name) is not None for name in WORKER_NAMES}
        lines = [
            f"{log.name}: {line}"
            for log in logs
            for line in log.read_text(errors="replace").splitlines()
            if line and not SETTLED_LINE.match(line)
        ]
        positions = {
            name: {
                topic: sum(max(0, o) for o in committed_offsets(
                    self.dep.bootstrap, self.dep.topics.group(name),
                    self.dep.topics.physical(topic), PARTITIONS,
                ).values())
                for topic in ("requests", "events")
            }
            for name in WORKER_NAMES
        }  # fmt: skip
        return f"serve alive: {self.proc.poll() is None}; children alive: {alive}; " + (
            f"committed positions: {positions}; {self.dep.readable_ends()}; "
            f"log lines: {lines[-40:]}"
        )

    def kill_instance(self) -> None:
        """SIGKILL this serve and every child at once, as the loss of its host would."""
        os.kill(self.proc.pid, signal.SIGSTOP)  # restarts nothing meanwhile
        for pid in self.worker_pids():
            os.kill(pid, signal.SIGKILL)
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._stderr.close()

    def kill_worker(
        self, process: str, timeout_s: float = 10.0, hold_s: float = 0.0
    ) -> tuple[int, int]:
        """SIGKILL the child running ``process``; returns (old pid, pid of its replacement
        once the supervisor has started it). ``hold_s``: the supervisor is stopped that long
        first, so the replacement starts no sooner."""
        old = self.worker_pid(process)
        assert old is not None, f"no live {process} child of serve {self.proc.pid}"
        if hold_s:
            os.kill(self.proc.pid, signal.SIGSTOP)
        os.kill(old, signal.SIGKILL)
        if hold_s:
            time.sleep(hold_s)
            os.kill(self.proc.pid, signal.SIGCONT)
        new: list[int] = []

        def restarted() -> bool:
            pid = self.worker_pid(process)
            if pid is not None and pid != old:
                new.append(pid)
                return True
            return False

        wait_for(restarted, timeout_s, f"the supervisor to restart {process}", poll_s=0.05)
        return old, new[-1]

    def stop(self) -> int:
        """SIGTERM: the supervisor stops its children and exits 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        self._stderr.close()
        return code


# --- the installed command on Kafka ---------------------------------------------------------


@dataclass(frozen=True)
class ServeSpec:
    """One ``callgate serve`` instance (``KafkaServe``'s options)."""

    flags: bool = False
    instance_id: str = "i0"


@dataclass(frozen=True)
class DeploymentSpec:
    """What a test module's ``kafka_deployment`` is (tests/conftest.py), given as the module's
    ``KAFKA_DEPLOYMENT``. ``label`` names its directory and topic prefix; ``profile``: a
    profile file, a function writing one under the deployment's directory, or ``None`` for
    the default; ``serve``: the ``callgate serve`` instances running for the whole module
    (``kafka_serve`` gives the first)."""

    label: str
    profile: Path | Callable[[Path], Path] | None = None
    serve: tuple[ServeSpec, ...] = (ServeSpec(),)


@contextlib.contextmanager
def serving(dep: Deployment, logs: Path, instances: Sequence[ServeSpec]) -> Iterator[KafkaServe]:
    """``callgate serve`` instances of ``dep``, every one ready, for the block (their logs
    in ``logs``: ``serve.log``, then ``serve-<instance id>.log``); stopped after it, the
    first last, and the first must exit 0. Gives the first."""
    assert instances, "a served deployment runs at least one serve"
    servers: list[KafkaServe] = []
    try:
        for n, spec in enumerate(instances):
            log = logs / ("serve.log" if n == 0 else f"serve-{spec.instance_id}.log")
            servers.append(KafkaServe(dep, log, flags=spec.flags, instance_id=spec.instance_id))
        for server in servers:
            server.wait_ready()
        yield servers[0]
    finally:
        for server in reversed(servers[1:]):
            server.stop()
        code = servers[0].stop() if servers else 0
    assert code == 0, servers[0].log.read_text()


def cli(dep: Deployment, *args: str, rc: int | None = 0, timeout: float = 90.0) -> Run:
    """``callgate --json --backend kafka --bootstrap-servers B ARGS`` with the deployment's
    prefix, partitions and state dir in the environment; asserts ``rc`` and no traceback."""
    argv = [
        *callgate_argv(), "--json", "--backend", "kafka", "--bootstrap-servers", dep.bootstrap,
        "--state-dir", str(dep.state_dir),
    ]  # fmt: skip
    if dep.profile is not None:
        argv += ["--profile", str(dep.profile)]
    argv += list(args)
    env = {
        **cli_env(),
        "CALLGATE_TOPIC_PREFIX": dep.prefix,
        "CALLGATE_PARTITIONS": str(PARTITIONS),
        "CALLGATE_DEV": "1" if dep.dev else "0",
        **({"CALLGATE_CONFIG": str(dep.config)} if dep.config is not None else {}),
    }
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, timeout=timeout, check=False
    )
    result = Run(argv, proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in result.stderr, f"a traceback escaped: {result}"
    if rc is not None:
        assert result.returncode == rc, f"expected exit {rc}: {result}"
    return result


def cg(dep: Deployment, *args: str, rc: int = 0) -> Any:
    """A reporting command's one JSON value."""
    return cli(dep, *args, rc=rc).value


_CLI_OPERATORS: dict[str, str] = {}


def cli_ops(dep: Deployment) -> str:
    """A ``callgate-operator`` session of this deployment (reads every tenant), issued once."""
    if dep.prefix not in _CLI_OPERATORS:
        _CLI_OPERATORS[dep.prefix] = cli_session(dep, "operator", "ops", OPERATOR_ROLE)
    return _CLI_OPERATORS[dep.prefix]


def cli_session(dep: Deployment, user: str, tenant: str, roles: str) -> str:
    token = cg(dep, "session", "issue", "--user", user, "--tenant", tenant, "--roles", roles)
    assert isinstance(token["token"], str) and token["token"]
    return str(token["token"])


def cli_propose(
    dep: Deployment,
    token: str,
    tool: str,
    args: Mapping[str, Any],
    key: str | None = None,
    approval_id: str | None = None,
) -> dict[str, Any]:
    """``callgate propose``: a settled call exits 0 whatever its outcome (a denial too)."""
    argv = propose_argv(token, tool, json.dumps(dict(args)), key, approval_id)
    return checked_answer(cg(dep, *argv))


def pending_ids(rows: Sequence[Mapping[str, Any]]) -> set[str]:
    return {str(r["invocation_id"]) for r in rows}


# --- scenarios shared by the Kafka tests ---------------------------------------------------

REFUND = {"order_id": "ORD-42", "amount_cents": 5000, "currency": "EUR"}  # < 10000: owner
PROVIDER_EVENTS = {"DryRunRequested", "ExecutionRequested", "ExecutionStarted"}


def token(gate: Gateway, user: str, tenant: str, *roles: str) -> str:
    """A development session token (the session, not the arguments, names the actor)."""
    return gate.app.session_issuer.issue(user, tenant, list(roles), gate.app.clock())


def operator(gate: Gateway) -> str:
    """A session that reads every tenant (``callgate-operator``, domain/scope.py)."""
    return token(gate, "operator", "ops", OPERATOR_ROLE)


def lifecycle_scenario(dep: Deployment, gate: Gateway) -> None:
    """C2: a read executes after the ACL alone. C5/C11: a refund stops at
    ``approval_required`` with its dry-run; the pending view (a compacted topic) lists it;
    the owner approves; the view key is tombstoned; the confirmed call executes once (C4);
    the same key replays the stored result (C8); the audit names the approval (C9)."""
    alice = token(gate, "alice", "acme", "support")
    read = gate.propose(alice, "tickets.read", {"ticket_id": "T-1"})
    assert read["outcome"] == "executed" and read["settled"] is True, read
    assert read["result"]["ticket_id"] == "T-1"

    key = f"refund-{uuid.uuid4().hex[:8]}"
    before = len(gate.effects())
    first = gate.propose(alice, "refunds.issue", REFUND, idempotency_key=key)
    assert first["outcome"] == "approval_required", first
    inv = first["invocation_id"]
    assert first["dry_run"]["order_id"] == "ORD-42" and first["dry_run"]["amount_cents"] == 5000
    assert "result" not in first and "approval_id" not in first
    assert len(gate.effects()) == before  # C5: a dry-run changes nothing

    assert gate.backend.wait(
        lambda: inv in {p["invocation_id"] for p in gate.pending(operator(gate))}, 30
    )
    [pending] = [p for p in gate.pending(alice) if p["invocation_id"] == inv]
    assert pending["tool"] == "refunds.issue" and pending["actor"] == "alice"
    assert pending["confirmation"] == "owner" and pending["dry_run"] == first["dry_run"]
    assert pending["expires_at"] > gate.app.clock()
    gina = token(gate, "gina", "globex", "support")
    assert inv not in {p["invocation_id"] for p in gate.pending(gina)}  # other tenant

    approval = gate.approve(inv, alice)
    assert approval["invocation_id"] == inv and approval["approval_id"]
    assert gate.backend.wait(lambda: gate.backend.view("pending", inv) is None, 30)
    view = [r for r in view_records(dep, "pending") if r[0] == inv]
    assert [value is None for _, value in view] == [False, True], view  # put, then tombstone

    done = gate.propose(alice, "refunds.issue", REFUND, key, approval["approval_id"])
    assert done["outcome"] == "executed", done
    assert done["result"]["order_id"] == "ORD-42" and done["result"]["amount_cents"] == 5000
    again = gate.propose(alice, "refunds.issue", REFUND, idempotency_key=key)
    assert again["outcome"] == "replayed", again
    assert again["result"] == done["result"]
    assert again["replay_of"]["invocation_id"] == done["invocation_id"]

    mine = [e for e in gate.effects() if e["invocation_id"] == done["invocation_id"]]
    assert len(mine) == 1 and mine[0]["tool"] == "refunds.issue", mine
    assert not [e for e in gate.effects() if e["invocation_id"] == again["invocation_id"]]
    [record] = gate.audit(done["invocation_id"], session=operator(gate))
    assert record["proposed_by"] == "model" and record["outcome"] == "executed"
    auth = record["authorized_by"]
    assert auth["decision"] == "permit" and auth["principal"]["user"] == "alice"
    assert auth["approval"]["approved_invocation_id"] == inv


def v1_scenario(dep: Deployment, gate: Gateway) -> None:
    """V1 / C6: a mutation naming another user is ``identity_spoof``; no provider sees it."""
    alice = token(gate, "alice", "acme", "support")
    before = gate.effects()
    args = {"title": "x", "requester_id": "mallory"}
    answer = gate.propose(alice, "tickets.create", args, idempotency_key=f"v1-{uuid.uuid4()}")
    assert answer["outcome"] == "identity_spoof", answer
    assert answer["error"]["code"] == "identity_spoof"
    assert gate.effects() == before
    types = dep.event_types(answer["invocation_id"])
    assert "ProposalRejected" in types and not PROVIDER_EVENTS & set(types), types


def v2_scenario(dep: Deployment, gate: Gateway) -> None:
    """V2 / C11: an approval for one set of arguments presented with another is
    ``approval_mismatch`` naming ``args_hash``; the approved call then runs exactly once
    and the same key replays it."""
    alice = token(gate, "alice", "acme", "support")
    key = f"v2-{uuid.uuid4().hex[:8]}"
    refund = {"order_id": "ORD-7", "amount_cents": 700, "currency": "EUR"}
    first = gate.propose(alice, "refunds.issue", refund, idempotency_key=key)
    assert first["outcome"] == "approval_required", first
    approval_id = gate.approve(first["invocation_id"], alice)["approval_id"]

    swapped = gate.propose(
        alice, "refunds.issue", {**refund, "amount_cents": 9000}, key, approval_id
    )
    assert swapped["outcome"] == "approval_mismatch", swapped
    error = swapped["error"]
    assert error["code"] == "approval_mismatch"
    assert "args_hash" in json.dumps(error), error  # names the differing binding
    assert not PROVIDER_EVENTS & set(dep.event_types(swapped["invocation_id"]))

    done = gate.propose(alice, "refunds.issue", refund, key, approval_id)
    assert done["outcome"] == "executed", done
    again = gate.propose(alice, "refunds.issue", refund, idempotency_key=key)
    assert again["outcome"] == "replayed" and again["result"] == done["result"], again
    effects = [e for e in gate.effects() if e["target"] == "ORD-7"]
    assert len(effects) == 1 and effects[0]["invocation_id"] == done["invocation_id"], effects


def view_records(dep: Deployment, view: str) -> list[tuple[str, Any]]:
    """A view topic's records as (key, value or None for a tombstone), in order; values
    decoded with the published view schemas."""
    out: list[tuple[str, Any]] = []
    for record in read_partitions_to_end(dep.bootstrap, dep.topics.view(view)):
        value = None if record.value is None else VIEWS.decode(record.value)[1]
        out.append(((record.key or b"").decode(), value))
    return out


PROBE_TICKET = {"title": "printer on fire", "requester_id": "alice"}


def key_on(partition: int) -> str:
    """A fresh idempotency key whose invocation lands on ``partition`` (tenant ``acme``)."""
    while True:
        key = uuid.uuid4().hex
        if partition_for(partition_key("acme", key, "").encode(), PARTITIONS) == partition:
            return key


class PartitionProber:
    """Proposes ``tickets.create`` on one partition in a loop, noting each answer's time
    and outcome (the freeze test and ``make bench-freeze`` time enforcement with it)."""

    def __init__(self, dep: Deployment, partition: int) -> None:
        self.partition = partition
        # (sent, answered) in ms, outcome, invocation id
        self.answers: list[tuple[int, int, str, str]] = []
        self._gate = dep.connect()
        self._token = token(self._gate, "alice", "acme", "support")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            key = key_on(self.partition)
            sent = time.time_ns() // 1_000_000
            answer = self._gate.propose(
                self._token, "tickets.create", PROBE_TICKET, idempotency_key=key
            )
            done = time.time_ns() // 1_000_000
            self.answers.append((sent, done, str(answer["outcome"]), str(answer["invocation_id"])))

    def seen_after(self, since_ms: int, outcome: str, timeout_s: float = 30.0) -> float:
        """Seconds from ``since_ms`` to the first answer after it with ``outcome``."""
        return (self.first(since_ms, outcome, timeout_s)[1] - since_ms) / 1000

    def first(self, since_ms: int, outcome: str, timeout_s: float = 30.0) -> tuple[int, int, str]:
        """The first answer after ``since_ms`` with ``outcome``: sent and answered (ms), and
        its invocation id."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for sent, at, seen, invocation in list(self.answers):
                if at >= since_ms and seen == outcome:
                    return sent, at, invocation
            time.sleep(0.01)
        raise AssertionError(f"p{self.partition} never {outcome}: {self.answers[-5:]}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self._gate.close()


# Two ``serve`` instances of one deployment (the ``pair`` fixture of tests/e2e).
Pair = tuple[Deployment, KafkaServe, KafkaServe]
