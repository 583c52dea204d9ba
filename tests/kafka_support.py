"""Shared helpers for the tests of the whole service on the Kafka backend.

``KafkaServe`` runs the installed ``callgate serve --backend kafka`` as a subprocess (the
supervisor that spawns one ``python -m callgate.adapters.kafka.worker <process>`` child per
process) under a topic prefix of its own, so that test modules share one broker but no
topics, consumer groups or transactional ids. ``wait_ready`` drives one call through every
process (decider, executor and the four projections) before a test starts. ``cli`` runs
the installed command against a deployment; ``lifecycle_scenario``, ``v1_scenario`` and
``v2_scenario`` are run on tansu and on Apache Kafka alike. ``run_with_own_broker`` runs the
commands that start a broker of their own (``bench``, ``chaos``).

Group settings: tansu's consumer-group joins take about ``session.timeout.ms`` (docs/contract.md
"Known tansu gaps"), so serve hands its children ``session.timeout.ms=6000`` and a 500 ms
heartbeat through ``CALLGATE_KAFKA_CONSUMER``; with librdkafka's default a (re)started
child would be away for about half a minute.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pytest

from callgate.adapters.avro_codec import AvroCodec, MalformedEvent
from callgate.adapters.kafka.client import Record, read_partitions_to_end
from callgate.adapters.kafka.topics import Topics
from callgate.adapters.view_codec import ViewCodec
from callgate.bootstrap import Settings
from callgate.domain import events as ev
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.sdk import Gateway, connect
from tests.e2e.helpers import REPO, Run, callgate_argv, checked_answer, cli_env, propose_argv

PARTITIONS = 3  # few partitions keep joins and restores short; >1 exercises co-partitioning
FAST_GROUPS = "session.timeout.ms=6000,heartbeat.interval.ms=500"
CODEC = AvroCodec.default()
VIEWS = ViewCodec.default()
WORKER_MODULE = "callgate.adapters.kafka.worker"


def run_with_own_broker(
    state_dir: Path, *args: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """``callgate --json --state-dir D ARGS`` of the Python running the tests, for commands
    that start a tansu broker of their own (``bench``, ``chaos``); skips, as the suite's
    broker fixture does, only where no tansu binary is installed."""
    from callgate.adapters.kafka.tansu import BrokerUnavailable, find_tansu

    try:
        find_tansu()
    except BrokerUnavailable as exc:
        pytest.skip(f"kafka tests skipped: {exc}")
    argv = [sys.executable, "-m", "callgate.surfaces.cli", "--json", "--state-dir", str(state_dir)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "services"), str(REPO / "projections")])
    return subprocess.run(
        [*argv, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False
    )


# What librdkafka's own log lines look like when they reach stderr (``%3|1700000000.123|FAIL|``
# from its default logger, or a Python log record naming it).
LIBRDKAFKA_MARKS = ("%3|", "%4|", "%5|", "%6|", "%7|", "rdkafka")


def librdkafka_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that come from librdkafka (none may, unless ``-v``)."""
    return [line for line in stderr.splitlines() if any(m in line for m in LIBRDKAFKA_MARKS)]


def unique_prefix(label: str) -> str:
    """A topic prefix no other test uses (topics, groups and transactional ids hang off it)."""
    return f"t-{label}-{uuid.uuid4().hex[:8]}"


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
        }
        if self.profile is not None:
            env["CALLGATE_PROFILE"] = str(self.profile)
        return env

    def settings(self) -> Settings:
        return Settings(
            backend="kafka",
            bootstrap_servers=self.bootstrap,
            topic_prefix=self.prefix,
            partitions=PARTITIONS,
            state_dir=self.state_dir,
            profile=self.profile,
        )

    def connect(self) -> Gateway:
        """The Python SDK on this deployment (its own client: ``close`` it)."""
        return connect(self.settings())

    # -- reading the log, as compliance would ------------------------------------------------

    def records(self, logical: str) -> list[Record]:
        """Every record of a logical topic, ``read_committed`` (on tansu that still shows
        records of aborted transactions: docs/contract.md "Known tansu gaps")."""
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

    def event_types(self, invocation_id: str) -> list[str]:
        """The types of the ``events`` records of one invocation, in log order."""
        return [e.event_type for _, e in self.events() if e.invocation_id == invocation_id]


# --- callgate serve ----------------------------------------------------------------------------


class KafkaServe:
    """``callgate serve`` on Kafka as a subprocess; stderr goes to a log file."""

    def __init__(self, dep: Deployment, log: Path, flags: bool = False) -> None:
        """``flags``: the global options as flags (``--backend kafka --bootstrap-servers B
        --state-dir D --profile P``) instead of ``CALLGATE_*`` variables."""
        self.dep = dep
        self.log = log
        self._stderr: TextIO = log.open("w")
        argv, env = [*callgate_argv()], dep.env()
        if flags:
            argv += ["--backend", "kafka", "--bootstrap-servers", dep.bootstrap]
            argv += ["--state-dir", str(dep.state_dir)]
            if dep.profile is not None:
                argv += ["--profile", str(dep.profile)]
            for name in ("BACKEND", "BOOTSTRAP_SERVERS", "STATE_DIR", "PROFILE"):
                env.pop(f"CALLGATE_{name}", None)
        argv.append("serve")
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env={**cli_env(), **env},
            cwd=REPO,
        )

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until every process has joined its group and handles input: a refund reaches
        ``approval_required`` (decider, executor's dry-run, status), shows in the pending
        view and the audit (pending, audit projections), and a denial of it is answered
        (decisions projection). Leaves no pending approval and no side effect behind."""
        deadline = time.monotonic() + timeout_s
        while "callgate serve" not in self.log.read_text():
            assert self.proc.poll() is None, f"serve exited early: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"serve not up: {self.log.read_text()}"
            time.sleep(0.05)
        gate = self.dep.connect()
        try:
            token = gate.app.session_issuer.issue("probe", "acme", ["support"], gate.app.clock())
            refund = {"order_id": "ORD-READY", "amount_cents": 100, "currency": "EUR"}
            left = max(1.0, deadline - time.monotonic())
            answer = gate.propose(token, "refunds.issue", refund, "ready-probe", timeout_s=left)
            assert answer["outcome"] == "approval_required", (answer, self.log.read_text())
            inv = answer["invocation_id"]
            gate.backend.wait(lambda: gate.backend.view("pending", inv) is not None, 30)
            gate.backend.wait(lambda: bool(gate.audit(inv, session=operator(gate))), 30)
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

    def kill_worker(self, process: str, timeout_s: float = 10.0) -> tuple[int, int]:
        """SIGKILL the child running ``process``; returns (old pid, pid of its replacement
        once the supervisor has started it)."""
        old = self.worker_pid(process)
        assert old is not None, f"no live {process} child of serve {self.proc.pid}"
        os.kill(old, signal.SIGKILL)
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


# --- scenarios shared by the tansu and the Apache Kafka tests --------------------------------

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
