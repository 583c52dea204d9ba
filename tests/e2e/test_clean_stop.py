"""A clean stop, every time (docs/contract.md, "Command line": stopping).

SIGTERM or SIGINT, at a random moment from start-up to steady work with calls in flight,
stops ``callgate serve`` (embedded), ``serve --http`` and ``callgate mcp`` within the grace
period, ``STOPS`` times each (``CALLGATE_STOPS``, 200 by default): none hangs. A signal
handler takes no lock (``callgate.stopping``): one that called ``Event.set`` hung once in
33 stops, waiting on the lock of the very ``Event`` the interrupted main thread was in.
A stop that lands after start-up exits 0.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tools.ports import free_port

from callgate.adapters.kafka.serve import create_topics
from callgate.bootstrap import Settings, bootstrap
from callgate.surfaces.sdk import connect
from tests.e2e.helpers import callgate_argv, cli_env
from tests.kafka_support import Deployment, unique_prefix

pytestmark = [pytest.mark.e2e, pytest.mark.stop]

STOPS = int(os.environ.get("CALLGATE_STOPS", "200"))
GRACE_S = 10.0
# A stop takes a start (a second or two under load) and the stop itself: 200 of them need
# more than the suite's 300 s per test.
STOP_TEST_TIMEOUT_S = 1800  # serve's documented grace: its supervisor waits 10 s for its children
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def default_signals() -> None:
    """In the child before exec: SIGINT as a terminal gives it. A runner started in the
    background ignores SIGINT, and an ignored signal stays ignored across exec until the
    program sets a handler, which would hide stops that land during start-up."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_repeatedly(
    start: Callable[[], subprocess.Popen[bytes]],
    ready: Callable[[], bool],
    log: Path,
    rng: random.Random,
    stops: int = STOPS,
) -> Counter[str]:
    """Start and signal ``stops`` times: every other stop at a random moment of start-up,
    the others a random moment (up to 0.5 s) after ``ready``. Asserts none hung past
    ``GRACE_S`` and every stop after start-up exited 0; returns how
    many of each kind ran."""
    ended: Counter[str] = Counter()
    for n in range(stops):
        proc = start()
        late = n % 2 == 1
        if late:
            deadline = time.monotonic() + 60
            while not ready():
                assert proc.poll() is None, f"stop {n}: exited early: {log.read_text()}"
                assert time.monotonic() < deadline, f"stop {n}: not up: {log.read_text()}"
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 0.5))
        else:
            time.sleep(rng.uniform(0.0, 1.0))
        sig = rng.choice(SIGNALS)
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(
                f"stop {n}: {sig.name} did not stop it within {GRACE_S}s: {log.read_text()[-3000:]}"
            ) from None
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        if late:
            assert code == 0, f"stop {n}: {sig.name} after start-up: exit {code}: {log.read_text()}"
        ended["after start-up" if late else "during start-up"] += 1
    return ended


@pytest.fixture
def load(tmp_path: Path) -> Iterator[Path]:
    """A state directory that a client keeps proposing calls to (calls in flight while
    serve starts and stops); the client stops with the test."""
    state = tmp_path / "state"
    state.mkdir()
    stop = threading.Event()

    def propose() -> None:
        gate = connect(Settings(state_dir=state, dev=True, timeout_s=2.0))
        try:
            alice = gate.app.session_issuer.issue("alice", "acme", ["support"], gate.app.clock())
            while not stop.is_set():
                gate.propose(alice, "tickets.read", {"ticket_id": "T-1"}, timeout_s=0.5)
        finally:
            gate.close()

    bootstrap(Settings(state_dir=state, dev=True)).keys  # noqa: B018  (keys made once)
    thread = threading.Thread(target=propose, daemon=True)
    thread.start()
    yield state
    stop.set()
    thread.join(timeout=10)


def stop_serve(load: Path, log: Path, args: list[str], ready: str, seed: int) -> Counter[str]:
    """``callgate serve ARGS`` on ``load``'s state directory, stopped ``STOPS`` times;
    ``ready``: the text of its log that says it has started."""

    def start() -> subprocess.Popen[bytes]:
        argv = [*callgate_argv(), "--state-dir", str(load), "serve", *args]
        with log.open("w") as err:
            return subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=err, env=cli_env(),
                preexec_fn=default_signals,
            )  # fmt: skip

    return stop_repeatedly(start, lambda: ready in log.read_text(), log, random.Random(seed))


@pytest.mark.timeout(STOP_TEST_TIMEOUT_S)
def test_serve_stops_cleanly_every_time(load: Path, tmp_path: Path) -> None:
    ended = stop_serve(load, tmp_path / "serve.log", [], "callgate serve (pid", 44)
    print(f"\nserve: {STOPS} stops, none over {GRACE_S:g}s: {dict(ended)}")


@pytest.mark.timeout(STOP_TEST_TIMEOUT_S)
def test_serve_http_stops_cleanly_every_time(load: Path, tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    log = tmp_path / "serve-http.log"
    ended = stop_serve(load, log, ["--http", address], "http://127.0.0.1", 45)
    print(f"\nserve --http: {STOPS} stops, none over {GRACE_S:g}s: {dict(ended)}")


INITIALIZE = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "clean-stop", "version": "1"},
        },
    }
)


@pytest.mark.timeout(STOP_TEST_TIMEOUT_S)
def test_mcp_stops_cleanly_every_time(load: Path, tmp_path: Path) -> None:
    """Started once it has answered ``initialize`` over stdio: its stop signals are set up
    before it reads its input."""
    log = tmp_path / "mcp.log"
    app = bootstrap(Settings(state_dir=load, dev=True))
    alice = app.session_issuer.issue("alice", "acme", ["support"], app.clock())
    latest: list[subprocess.Popen[bytes]] = []

    def start() -> subprocess.Popen[bytes]:
        argv = [*callgate_argv(), "--state-dir", str(load), "mcp", "--session", alice]
        with log.open("w") as err:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=cli_env(),
                preexec_fn=default_signals,
            )  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write(INITIALIZE.encode() + b"\n")
        proc.stdin.flush()
        latest[:] = [proc]
        return proc

    def ready() -> bool:  # its answer to initialize is on stdout
        out = latest[-1].stdout
        assert out is not None
        return bool(select.select([out], [], [], 0)[0])

    ended = stop_repeatedly(start, ready, log, random.Random(46))
    print(f"\ncallgate mcp: {STOPS} stops, none over {GRACE_S:g}s: {dict(ended)}")


@pytest.mark.kafka
@pytest.mark.timeout(STOP_TEST_TIMEOUT_S)
def test_serve_on_kafka_stops_cleanly_every_time(kafka_bootstrap: str, tmp_path: Path) -> None:
    """The supervisor and its children: SIGTERM or SIGINT stops them all within the grace
    period (``CALLGATE_KAFKA_STOPS`` times, 40 by default: each start spawns a child per
    process)."""
    dep = Deployment(kafka_bootstrap, unique_prefix("stop"), tmp_path / "state")
    create_topics(bootstrap(dep.settings()))
    log = tmp_path / "serve-kafka.log"

    def start() -> subprocess.Popen[bytes]:
        argv = [*callgate_argv(), "serve", "--instance-id", "stop-0"]
        with log.open("w") as err:
            return subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=err, env={**cli_env(), **dep.env()},
                preexec_fn=default_signals,
            )  # fmt: skip

    stops = int(os.environ.get("CALLGATE_KAFKA_STOPS", "40"))
    ended = stop_repeatedly(
        start, lambda: "callgate serve (pid" in log.read_text(), log, random.Random(47), stops
    )
    print(f"\nserve on Kafka: {stops} stops, none over {GRACE_S:g}s: {dict(ended)}")
