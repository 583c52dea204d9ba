"""The embedded runner over the SQLite store: exactly once, crash-safe, poison-tolerant.

Toy processes (``tests.toys``) stand in for the deciders; what is under test is the runner's
commit sequence (position, outputs, state and views in one transaction), dead-lettering
(``malformed_event``), follow-up, timers, recovery and the runner lock. Run as a script, this
file is the worker that the kill -9 test starts and SIGKILLs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.toys import Counting, Expiring, Recovering, proposal

from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.embedded.ownership import RunnerLockNotHeld
from callgate.adapters.embedded.runner import EmbeddedRunner
from callgate.adapters.embedded.store import EmbeddedStore
from callgate.domain.events import (
    ApprovalGranted,
    DryRunFailed,
    DryRunRecorded,
    Event,
    EventDeadLettered,
    ExecutionStarted,
    ExecutionUncertain,
    ProposalRejected,
)
from callgate.domain.process_port import Output, Process, ViewRecord

CODEC = AvroCodec.default()
REPO = Path(__file__).resolve().parents[2]


class Tally(Counting):
    """Consumes the counter's outputs ("events"): a second hop, views only, no outputs."""

    name = "tally"
    inputs = frozenset({"events"})

    def handle(self, state: int, event: Event, now_ms: int) -> tuple[int, Sequence[Output]]:
        if not isinstance(event, ExecutionStarted):
            return state, []
        return state + 1, [ViewRecord("tally", event.partition_key, json.dumps(state + 1))]


class FollowingUp(Counting):
    """Emits one event, then a second in ``follow_up`` (as the executor calls providers)."""

    name = "follower"

    def handle(self, state: int, event: Event, now_ms: int) -> tuple[int, Sequence[Output]]:
        first = DryRunFailed(
            event_id=f"dr-{event.event_id}",
            invocation_id=event.invocation_id,
            partition_key=event.partition_key,
            message="first half",
        )
        return state, [first]

    def follow_up(
        self, state: int, committed: Sequence[Event], now_ms: int
    ) -> tuple[int, Sequence[Output]]:
        done = [
            DryRunRecorded(
                event_id=f"rec-{ev.event_id}",
                invocation_id=ev.invocation_id,
                partition_key=ev.partition_key,
                snapshot_json="{}",
                snapshot_hash="h",
            )
            for ev in committed
            if isinstance(ev, DryRunFailed)
        ]
        return state + len(done), done


def open_runner(
    state_dir: Path, *processes: Process[Any], now: list[int] | None = None, batch_size: int = 500
) -> EmbeddedRunner:
    clock = now if now is not None else [1_000]
    store = EmbeddedStore(state_dir, CODEC)
    runner = EmbeddedRunner(store, processes, CODEC, lambda: clock[0], batch_size=batch_size)
    assert runner.try_acquire()
    return runner


def decoded(store: EmbeddedStore, topic: str) -> list[Event]:
    return [CODEC.decode(row.payload) for row in store.read_log(topic, limit=1_000_000)]


def assert_counted_exactly_once(store: EmbeddedStore, keys: Sequence[str]) -> None:
    """Each input has exactly one output, attempts per key are 1..n, states and views exact."""
    outputs = [ev for ev in decoded(store, "events") if isinstance(ev, ExecutionStarted)]
    ids = [ev.event_id for ev in outputs]
    assert len(ids) == len(set(ids)), "duplicate outputs"
    assert sorted(ids) == sorted(f"out-in-{i}" for i in range(len(keys)))
    expected = Counter(keys)
    for key, n in expected.items():
        attempts = sorted(ev.attempt for ev in outputs if ev.partition_key == key)
        assert attempts == list(range(1, n + 1))
    assert dict(store.view_items("counts")) == {k: json.dumps(n) for k, n in expected.items()}


# --- exactly once ------------------------------------------------------------------------


def test_counting_process_emits_exactly_one_output_per_input(tmp_path: Path) -> None:
    runner = open_runner(tmp_path, Counting(), Tally(), batch_size=64)
    keys = [f"k{i % 7}" for i in range(1_000)]
    runner.store.append([proposal(i, k) for i, k in enumerate(keys)])
    runner.run_until_idle()
    assert_counted_exactly_once(runner.store, keys)
    # A second pass is a no-op: the positions were committed with the outputs.
    assert runner.run_until_idle() == 0
    assert dict(runner.store.view_items("tally")) == dict(runner.store.view_items("counts"))


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=st.lists(st.lists(st.sampled_from("abc"), max_size=12), min_size=1, max_size=6),
    batch_size=st.integers(min_value=1, max_value=9),
)
def test_counts_are_exact_however_appends_and_steps_interleave(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[str]], batch_size: int
) -> None:
    runner = open_runner(tmp_path_factory.mktemp("s"), Counting(), batch_size=batch_size)
    keys: list[str] = []
    for chunk in batches:
        runner.store.append([proposal(len(keys) + j, k) for j, k in enumerate(chunk)])
        keys += chunk
        runner.step(runner.processes[0])  # at most one batch between appends
    runner.run_until_idle()
    assert_counted_exactly_once(runner.store, keys)
    runner.release()
    runner.store.close()


# --- kill -9 -----------------------------------------------------------------------------


def worker(state_dir: str, mode: str) -> None:
    """Subprocess body: run counter + tally; "serve" forever or "finish" when idle."""
    runner = open_runner(Path(state_dir), Counting(), Tally(), batch_size=10)
    print("ready", flush=True)
    if mode == "finish":
        runner.run_until_idle(max_seconds=60)
        return
    runner.serve(threading.Event())


def start_worker(state_dir: Path, mode: str) -> subprocess.Popen[str]:
    paths = [REPO, REPO / "services", REPO / "projections"]  # REPO: the worker imports tests.toys
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths))}
    proc = subprocess.Popen(
        [sys.executable, __file__, "worker", str(state_dir), mode],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    """kill -9 mid-stream, several times; every input ends up processed exactly once."""
    rng = random.Random(0xCA11)
    store = EmbeddedStore(tmp_path, CODEC)
    keys = [f"k{rng.randrange(40)}" for _ in range(3_000)]
    # 20 kills, each after new input arrives: whether a kill lands mid-stream depends on the
    # machine's speed, so there are enough of them for at least 5 to (typically 15 or more).
    chunks = [range(i, i + 150) for i in range(0, len(keys), 150)]
    appended = done = mid_stream_kills = 0
    for kill in range(20):
        if kill >= len(chunks) and done == appended:
            break  # nothing left in flight to kill
        proc = start_worker(tmp_path, "serve")
        if kill < len(chunks):  # input keeps arriving, from another process, while it runs
            store.append([proposal(i, keys[i]) for i in chunks[kill]])
            appended += len(chunks[kill])
        before = store.position("tally")
        deadline = time.monotonic() + 10
        while store.position("tally") == before and time.monotonic() < deadline:
            time.sleep(0.002)  # wait for the worker to get going (imports take a while)
        time.sleep(rng.uniform(0.0, 0.02))
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        done = len(store.read_log("events", limit=len(keys)))
        mid_stream_kills += 0 < done < appended
    finisher = start_worker(tmp_path, "finish")
    assert finisher.wait(timeout=60) == 0
    assert mid_stream_kills >= 5, mid_stream_kills  # the kills landed while work was in flight
    assert_counted_exactly_once(store, keys)
    assert dict(store.view_items("tally")) == dict(store.view_items("counts"))


class Failing(Counting):
    """Raises on one event id, as a buggy decider would."""

    def __init__(self, poison_id: str) -> None:
        super().__init__()
        self.poison_id = poison_id

    def handle(self, state: int, event: Event, now_ms: int) -> tuple[int, Sequence[Output]]:
        if event.event_id == self.poison_id:
            raise RuntimeError("decider bug")
        return super().handle(state, event, now_ms)


def test_an_event_the_handler_cannot_handle_is_dead_lettered_and_the_stream_goes_on(
    tmp_path: Path,
) -> None:
    """A handler exception never stops the stream: the event is dead-lettered with the
    reason, its key's state is left as it was before the event, every other event counts."""
    runner = open_runner(tmp_path, Failing("in-7"), batch_size=10)
    keys = [f"k{i % 2}" for i in range(10)]
    runner.store.append([proposal(i, k) for i, k in enumerate(keys)])
    runner.run_until_idle()
    dead = [e for e in decoded(runner.store, "dead-letter") if isinstance(e, EventDeadLettered)]
    assert len(dead) == 1
    assert "decider bug" in dead[0].reason and dead[0].source_offset == 8
    assert runner.store.position("counter") == 10
    assert dead[0].code == "malformed_event" and dead[0].invocation_id == "inv-7"
    counted = [e for e in decoded(runner.store, "events") if not isinstance(e, ProposalRejected)]
    assert len(counted) == 9  # in-7 counted nothing
    # the caller of the dropped request gets a coded outcome (adapters/failures.py)
    (answer,) = [e for e in decoded(runner.store, "events") if isinstance(e, ProposalRejected)]
    assert (answer.invocation_id, answer.code) == ("inv-7", "malformed_event")
    assert dict(runner.store.view_items("counts")) == {"k0": "5", "k1": "4"}


# --- poison input ------------------------------------------------------------------------


def test_poison_is_dead_lettered_once_and_the_stream_goes_on(tmp_path: Path) -> None:
    """``malformed_event`` (first in the order of checks (docs/contract.md)): kept with reason and
    bytes."""
    runner = open_runner(tmp_path, Counting(), FollowingUp())  # two readers of "requests"
    store = runner.store
    store.append([proposal(0, "a")])
    poison = b"\x00not-an-avro-event"
    store.append_raw("requests", "a", poison)
    granted = ApprovalGranted(
        event_id="g", invocation_id="x", partition_key="a", approval_id="A",
        approval_jti="j", approver="eve", expires_at=0,
    )  # fmt: skip
    store.append_raw("requests", "a", CODEC.encode(granted))  # a service event, client-written
    store.append([proposal(1, "a")])
    runner.run_until_idle()

    dead = decoded(store, "dead-letter")
    assert all(isinstance(ev, EventDeadLettered) for ev in dead)
    by_offset = {ev.source_offset: ev for ev in dead if isinstance(ev, EventDeadLettered)}
    assert sorted(by_offset) == [2, 3] and len(dead) == 2  # one each, not one per reader
    assert (
        by_offset[2].code == "malformed_event" and by_offset[2].original == b"\x00not-an-avro-event"
    )
    assert "marker" in by_offset[2].reason and by_offset[2].source_topic == "requests"
    assert "ApprovalGranted does not belong on topic requests" in by_offset[3].reason
    assert by_offset[3].original == CODEC.encode(granted)
    assert_counted_exactly_once(store, ["a", "a"])


# --- follow-up, timers, recovery -----------------------------------------------------------


def test_follow_up_outputs_are_committed_with_state(tmp_path: Path) -> None:
    runner = open_runner(tmp_path, FollowingUp())
    runner.store.append([proposal(i, f"k{i % 3}") for i in range(10)])
    runner.run_until_idle()
    recorded = [ev for ev in decoded(runner.store, "events") if isinstance(ev, DryRunRecorded)]
    assert sorted(ev.event_id for ev in recorded) == sorted(f"rec-dr-in-{i}" for i in range(10))
    with runner.store.transaction() as tx:
        states = tx.load_states("follower", ["k0", "k1", "k2"])
    assert states == {"k0": b"4", "k1": b"3", "k2": b"3"}


def test_timers_fire_once_when_due(tmp_path: Path) -> None:
    now = [5_000]
    runner = open_runner(tmp_path, Expiring(), now=now)
    runner.store.append([proposal(0, "a", occurred_at=5_000), proposal(1, "b", occurred_at=7_000)])
    runner.run_until_idle()
    assert decoded(runner.store, "events") == []
    now[0] = 6_000
    runner.run_until_idle()
    assert [ev.event_id for ev in decoded(runner.store, "events")] == ["exp-inv-0"]
    now[0] = 60_000
    runner.run_until_idle()
    runner.run_until_idle()
    assert [ev.event_id for ev in decoded(runner.store, "events")] == ["exp-inv-0", "exp-inv-1"]


def test_recover_runs_once_per_stored_key_on_taking_ownership(tmp_path: Path) -> None:
    """C12: the executor reconciles unfinished work whenever a runner takes ownership."""
    first = open_runner(tmp_path, Recovering(), batch_size=2)
    first.store.append([proposal(i, f"k{i % 5}") for i in range(12)])
    first.run_until_idle()
    assert decoded(first.store, "events")[-1].event_type == "ExecutionStarted"
    first._ownership.failed = True  # as if it had died holding the lock: the store stays dirty
    first.release()

    second = open_runner(tmp_path, Recovering(), batch_size=2, now=[42])
    second.run_until_idle()
    recovered = [
        ev for ev in decoded(second.store, "events") if ev.event_type != "ExecutionStarted"
    ]
    assert sorted(ev.execution_token for ev in recovered if isinstance(ev, ExecutionUncertain)) == [
        "2", "2", "2", "3", "3",
    ]  # fmt: skip
    second.run_until_idle()  # not again while it keeps ownership
    assert len(decoded(second.store, "events")) == 12 + 5


def test_recover_is_skipped_after_a_clean_stop(tmp_path: Path) -> None:
    """A runner that released the lock cleanly left nothing unfinished: no reconciliation."""
    first = open_runner(tmp_path, Recovering(), batch_size=2)
    first.store.append([proposal(i, f"k{i % 5}") for i in range(4)])
    first.run_until_idle()
    first.release()
    second = open_runner(tmp_path, Recovering(), batch_size=2, now=[42])
    second.run_until_idle()
    assert len(decoded(second.store, "events")) == 4


# --- loops ---------------------------------------------------------------------------------


def test_serve_in_a_thread_while_a_client_appends_and_polls_views(tmp_path: Path) -> None:
    """The ``callgate serve`` shape: one thread runs, another appends and reads views."""
    runner = open_runner(tmp_path, Counting(), Tally())
    stop = threading.Event()
    server = threading.Thread(target=runner.serve, args=(stop,))
    server.start()
    try:
        client = EmbeddedStore(tmp_path, CODEC)  # its own connections, as a CLI has
        for i in range(50):
            client.append([proposal(i, "k")])
        deadline = time.monotonic() + 10
        while client.view("tally", "k") != "50" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.view("tally", "k") == "50"
    finally:
        stop.set()
        server.join(timeout=10)
    assert not server.is_alive()


def test_run_until_runs_the_processes_until_the_call_settles(tmp_path: Path) -> None:
    runner = open_runner(tmp_path, Counting(), batch_size=3)
    runner.store.append([proposal(i, "k") for i in range(10)])
    assert runner.run_until(lambda: runner.store.view("counts", "k") == "10", timeout_s=10)
    assert not runner.run_until(lambda: runner.store.view("counts", "k") == "11", timeout_s=0.1)


# --- exclusivity ---------------------------------------------------------------------------


def test_runner_lock_is_exclusive_and_released_by_the_kernel_on_sigkill(tmp_path: Path) -> None:
    """One runner per state dir, so two executors never reconcile one execution (C12)."""
    holder = start_worker(tmp_path, "serve")
    runner = EmbeddedRunner(EmbeddedStore(tmp_path, CODEC), [Counting()], CODEC, lambda: 0)
    assert not runner.try_acquire()
    assert not runner.acquire(timeout=0.2)
    with pytest.raises(RunnerLockNotHeld):
        runner.step(runner.processes[0])
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert runner.acquire(timeout=5)
    runner.release()


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    worker(sys.argv[2], sys.argv[3])
