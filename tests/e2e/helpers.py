"""Run the installed ``callgate`` command as a subprocess (docs/contract.md "Command line").

Every helper asserts the command-line contract on the way: with ``--json`` stdout holds
exactly one JSON value, the exit code is the expected one, and stderr never carries a
Python traceback. ``python -m tests.e2e.helpers publish PLAN`` is the fast publisher of
the serve-crash tests: it appends proposals to the log (embedded or Kafka) without waiting
for them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from callgate.domain.scope import OPERATOR_ROLE, bound_id
from tests.dev_sessions import dev_token

if TYPE_CHECKING:
    from callgate.domain.events import ToolCallProposed


def _find_callgate() -> str | None:
    """The ``callgate`` installed beside the Python running the tests (the venv's), else PATH."""
    beside = Path(sys.executable).parent / "callgate"
    return str(beside) if beside.exists() else shutil.which("callgate")


CALLGATE = _find_callgate()
REPO = Path(__file__).resolve().parents[2]
DEFAULT_PROFILE = REPO / "services" / "callgate" / "profiles" / "default.yaml"
EXIT_OK, EXIT_FAILED, EXIT_MISUSE = 0, 1, 2


def cli_env(dev: bool = True) -> dict[str, str]:
    """The caller's environment without ``CALLGATE_*`` settings that would leak in.

    ``dev``: development mode (``CALLGATE_DEV=1``), on by default because the tests mint
    their sessions from the development issuer (``session``, ``callgate session issue``);
    tests of production mode turn it off.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env["CALLGATE_DEV"] = "1" if dev else "0"
    env["COLUMNS"] = "200"  # rich wraps at the terminal width; keep messages on one line
    return env


def callgate_argv() -> list[str]:
    assert CALLGATE is not None, "the callgate command is not installed on PATH"
    return [CALLGATE]


@dataclass(frozen=True)
class Run:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    @property
    def value(self) -> Any:
        """The one JSON value on stdout (``json.loads`` rejects a second value)."""
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"stdout is not exactly one JSON value ({exc}): {self}") from exc

    def __str__(self) -> str:
        return (
            f"{' '.join(self.argv[1:])}\n  exit {self.returncode}\n"
            f"  stdout: {self.stdout[:2000]!r}\n  stderr: {self.stderr[:2000]!r}"
        )


def run(
    state_dir: Path | None,
    *args: str,
    rc: int | None = EXIT_OK,
    json_mode: bool = True,
    profile: Path | None = None,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
    dev: bool = True,
) -> Run:
    """``callgate [--json] [--state-dir D] [--profile P] ARGS``; asserts ``rc`` when given.
    ``env`` adds variables to the clean environment (``cli_env``)."""
    argv = callgate_argv()
    if json_mode:
        argv.append("--json")
    if state_dir is not None:
        argv += ["--state-dir", str(state_dir)]
    if profile is not None:
        argv += ["--profile", str(profile)]
    argv += list(args)
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env={**cli_env(dev), **(env or {})},
        timeout=timeout,
        check=False,
    )
    result = Run(argv, proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in result.stderr, f"a traceback escaped: {result}"
    if rc is not None:
        assert result.returncode == rc, f"expected exit {rc}: {result}"
    return result


def cg(state_dir: Path, *args: str, rc: int = EXIT_OK, profile: Path | None = None) -> Any:
    """Run a reporting command with ``--json``; its one JSON value."""
    return run(state_dir, *args, rc=rc, profile=profile).value


_OPERATORS: dict[Path, str] = {}


def ops(state_dir: Path) -> str:
    """A ``callgate-operator`` session of this state dir (reads every tenant), issued once."""
    if state_dir not in _OPERATORS:
        _OPERATORS[state_dir] = session(state_dir, "operator", "ops", OPERATOR_ROLE)
    return _OPERATORS[state_dir]


def session(state_dir: Path, user: str, tenant: str, roles: str) -> str:
    """A development session token of the state directory's development issuer, as
    ``callgate session issue --user U --tenant T --roles R`` makes it: the same settings
    (this state directory, its ``callgate.toml``, the clean environment in development
    mode), the same issuer and key, made in this process instead of a command start-up per
    token (the tests of ``session issue`` itself run the command: test_cli_surface.py)."""
    from callgate.bootstrap import Settings

    settings = Settings.from_env(state_dir=state_dir, environ=cli_env(dev=True))
    token = dev_token(settings, user, tenant, [r for r in roles.split(",") if r])
    assert isinstance(token, str) and token
    return token


def propose(
    state_dir: Path,
    token: str,
    tool: str,
    args: dict[str, Any],
    key: str | None = None,
    approval_id: str | None = None,
    profile: Path | None = None,
) -> dict[str, Any]:
    """``callgate propose``: a settled call exits 0 whatever its outcome (a denial too)."""
    argv = propose_argv(token, tool, json.dumps(args), key, approval_id)
    return checked_answer(cg(state_dir, *argv, profile=profile))


def propose_argv(
    token: str, tool: str, args_json: str, key: str | None = None, approval_id: str | None = None
) -> list[str]:
    """The arguments of ``callgate propose``; ``args_json`` goes as given (misuse tests
    pass text that is not a JSON object)."""
    argv = ["propose", "--session", token, "--tool", tool, "--args", args_json]
    if key is not None:
        argv += ["--idempotency-key", key]
    if approval_id is not None:
        argv += ["--approval-id", approval_id]
    return argv


def checked_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """A ``propose`` answer names the invocation and its outcome; a refusal's error code is
    the outcome."""
    assert {"invocation_id", "outcome"} <= answer.keys(), answer
    if "error" in answer:
        assert answer["error"]["code"] == answer["outcome"], answer
    return answer


# --- callgate serve --------------------------------------------------------------------


class Serve:
    """A ``callgate serve`` subprocess; stderr goes to a file so the pipe never fills."""

    def __init__(self, state_dir: Path, log: Path, extra_env: dict[str, str] | None = None):
        self.log = log
        self._stderr: TextIO = log.open("w")
        argv = [*callgate_argv(), "--state-dir", str(state_dir), "serve"]
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env={**cli_env(), **(extra_env or {})},
        )

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Until serve holds the runner lock: it prints "callgate serve" only after that."""
        deadline = time.monotonic() + timeout
        while "callgate serve" not in self.log.read_text():
            assert self.proc.poll() is None, f"serve exited early: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"serve not up: {self.log.read_text()}"
            time.sleep(0.02)

    def freeze(self, state_dir: Path) -> None:
        """SIGSTOP serve at a moment it holds no write transaction on the event store.

        A server stopped inside ``BEGIN IMMEDIATE`` would block every client's append
        for the busy timeout, so stop, probe the write lock, and retry if it was held.
        """
        import sqlite3

        for _ in range(100):
            self.proc.send_signal(signal.SIGSTOP)
            probe = sqlite3.connect(state_dir / "events.sqlite3", timeout=0.05)
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                return
            except sqlite3.OperationalError:
                self.proc.send_signal(signal.SIGCONT)
                time.sleep(0.005)
            finally:
                probe.close()
        raise AssertionError("serve never let go of the event store's write lock")

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(timeout=10) == -signal.SIGKILL
        self._stderr.close()

    def stop(self) -> int:
        """SIGTERM: serve finishes its round, releases the lock and exits 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=15)
        self._stderr.close()
        assert "Traceback" not in self.log.read_text(), self.log.read_text()
        return code


# --- a stream of planned proposals, and the fast publisher (a separate process) ---------


@dataclass(frozen=True)
class Planned:
    """One proposal of the stream and the outcome it must settle with."""

    invocation_id: str
    tenant: str
    token: str
    tool: str
    args: dict[str, Any]
    key: str | None
    expect: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def proposal(self, now: int, producer: str) -> ToolCallProposed:
        """The event as the SDK builds it: partition key from tenant, key and invocation
        (docs/contract.md "Shape"), ids derived from the invocation id."""
        from callgate.domain import events as ev
        from callgate.domain.canonical import partition_key

        tenant = self.tenant if self.key is not None else ""
        return ev.ToolCallProposed(
            event_id=f"evt-{self.invocation_id}",
            invocation_id=self.invocation_id,
            partition_key=partition_key(tenant, self.key, self.invocation_id),
            correlation_id=self.invocation_id,
            occurred_at=now,
            producer=producer,
            session_token=self.token,
            tool=self.tool,
            args_json=json.dumps(self.args),
            idempotency_key=self.key,
        )


def make_plan(
    rng: random.Random, alice: str, gina: str, n: int, tag: str, keyed_deploys: bool = False
) -> list[Planned]:
    """Reads, keyed ticket creations (new, retried, conflicting, other tenant), refunds
    that stop at ``approval_required``, denials and spoofs. Keys start with ``tag``; with
    ``keyed_deploys`` the denied deploys carry a key too, so every mutation has one."""
    plan: list[Planned] = []
    created: list[Planned] = []  # first uses of a key that execute
    gina_keys: set[str] = set()

    def add(
        tenant: str, token: str, tool: str, args: dict[str, Any], key: str | None, expect: str
    ) -> Planned:
        # bound to the session as the SDK binds it (domain/scope.py)
        item = Planned(bound_id(token, uuid.uuid4().hex), tenant, token, tool, args, key, expect)
        plan.append(item)
        return item

    for i in range(n):
        roll = rng.random()
        if roll < 0.15:
            add("acme", alice, "tickets.read", {"ticket_id": f"T-{i}"}, None, "executed")
        elif roll < 0.45 or not created:
            ticket = {"title": f"ticket {i}", "requester_id": "alice"}
            created.append(add("acme", alice, "tickets.create", ticket, f"{tag}-{i}", "executed"))
        elif roll < 0.57:  # the agent retries: same key, same arguments (C8)
            first = rng.choice(created)
            add("acme", alice, first.tool, first.args, first.key, "replayed")
        elif roll < 0.62:  # same key, other arguments (C8)
            first = rng.choice(created)
            args = {**first.args, "title": f"changed {i}"}
            add("acme", alice, first.tool, args, first.key, "idempotency_conflict")
        elif roll < 0.67:  # the same key spelled by another tenant is another key
            first = rng.choice(created)
            assert first.key is not None
            expect = "replayed" if first.key in gina_keys else "executed"
            gina_keys.add(first.key)
            ticket = {"title": first.args["title"], "requester_id": "gina"}
            add("globex", gina, "tickets.create", ticket, first.key, expect)
        elif roll < 0.82:
            refund = {"order_id": f"ORD-{i}", "amount_cents": 500 + i, "currency": "EUR"}
            add("acme", alice, "refunds.issue", refund, f"{tag}-r{i}", "approval_required")
        elif roll < 0.90:
            deploy = {"service": "billing", "version": f"1.{i}", "environment": "staging"}
            key = f"{tag}-d{i}" if keyed_deploys else None
            add("acme", alice, "deploys.trigger", deploy, key, "tool_forbidden")
        elif roll < 0.95:
            add("globex", gina, "tickets.read", {"ticket_id": f"T-{i}"}, None, "tool_forbidden")
        else:
            spoof = {"title": f"spoof {i}", "requester_id": "mallory"}
            add("acme", alice, "tickets.create", spoof, f"{tag}-s{i}", "identity_spoof")
    return plan


def write_plan(
    path: Path,
    state_dir: Path,
    plan: Sequence[Planned],
    pause_s: float,
    env: dict[str, str] | None = None,
) -> None:
    """``env``: the ``CALLGATE_*`` settings of the deployment (Kafka), none for embedded."""
    doc = {
        "state_dir": str(state_dir),
        "pause_s": pause_s,
        "env": env or {},
        "items": [p.to_json() for p in plan],
    }
    path.write_text(json.dumps(doc))


def start_publisher(plan_file: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.helpers", "publish", str(plan_file)],
        cwd=REPO,
        env=cli_env(),
    )


def publish_plan(plan_file: Path) -> None:
    """Append every planned ``ToolCallProposed`` in order, one at a time, never waiting.

    Events are built the way the SDK builds them (partition key from tenant, key and
    invocation, docs/contract.md "Shape") and go through the SDK backend's ``publish`` (embedded, or
    Kafka where the plan carries a Kafka deployment's settings).
    """
    from callgate.bootstrap import Settings
    from callgate.surfaces.sdk import connect

    doc = json.loads(plan_file.read_text())
    os.environ.update(doc.get("env") or {})
    gate = connect(Settings.from_env(state_dir=Path(doc["state_dir"]), dev=True))
    try:
        for item in doc["items"]:
            gate.backend.publish([Planned(**item).proposal(gate.app.clock(), "e2e-publisher")])
            if doc["pause_s"]:
                time.sleep(doc["pause_s"])
    finally:
        gate.close()


def logged_event_types(state_dir: Path, invocation_id: str) -> list[str]:
    """The event types the embedded log holds for one invocation, in log order."""
    from callgate.adapters.embedded.store import EmbeddedStore

    store = EmbeddedStore(state_dir)
    try:
        return [row.event_type or "" for row in store.read_invocation(invocation_id)]
    finally:
        store.close()


def runner_lock_held(state_dir: Path) -> bool:
    """Does some process hold ``<state_dir>/runner.lock`` (the embedded runner's flock)?"""
    import fcntl

    fd = os.open(state_dir / "runner.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the lock if we got it
    return False


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "publish":
        publish_plan(Path(sys.argv[2]))
    else:
        sys.exit("usage: python -m tests.e2e.helpers publish PLAN_FILE")
