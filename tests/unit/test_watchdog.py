"""The watchdog of a Kafka worker's blocking client calls (adapters/kafka/watchdog.py), and
stopping on a signal without a lock in the handler (callgate/stopping.py)."""

from __future__ import annotations

import os
import signal
import threading

from callgate.adapters.kafka.watchdog import Watchdog
from callgate.stopping import stop_on_signals


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_call_past_its_bound_is_reported_once_with_its_step_and_wait() -> None:
    clock, stalls = Clock(), []
    dog = Watchdog(lambda step, waited: stalls.append((step, waited)), clock=clock)
    with dog.bounded("send_offsets_to_transaction", bound_s=15.0):
        clock.now += 15.0
        assert dog.check() is None  # at the bound: not past it
        clock.now += 1.0
        assert dog.check() == "send_offsets_to_transaction"
        assert dog.check() is None  # once
    assert stalls == [("send_offsets_to_transaction", 16.0)]


def test_calls_within_their_bound_and_no_call_at_all_are_not_stalls() -> None:
    clock, stalls = Clock(), []
    dog = Watchdog(lambda step, waited: stalls.append((step, waited)), clock=clock)
    for _ in range(3):
        with dog.bounded("flush", bound_s=15.0):
            clock.now += 10.0
            assert dog.check() is None
    clock.now += 1000.0  # idle between calls: nothing is waited on
    assert dog.check() is None and stalls == []


def test_a_nested_call_has_its_own_bound_and_the_outer_one_comes_back() -> None:
    clock, stalls = Clock(), []
    dog = Watchdog(lambda step, waited: stalls.append((step, waited)), clock=clock)
    with dog.bounded("outer", bound_s=100.0), dog.bounded("inner", bound_s=5.0):
        clock.now += 6.0
        assert dog.check() == "inner"
    assert stalls == [("inner", 6.0)]


def test_the_thread_reports_a_stall_by_itself() -> None:
    fired = threading.Event()
    dog = Watchdog(lambda step, waited: fired.set(), check_every_s=0.01)
    dog.start()
    try:
        with dog.bounded("commit_transaction", bound_s=0.05):
            assert fired.wait(5.0)
    finally:
        dog.stop()


def test_a_signal_sets_the_stop_event_from_a_thread_of_its_own() -> None:
    stop = threading.Event()
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        stop_on_signals(stop, signals=(signal.SIGUSR1,))
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.wait(5.0)
    finally:
        signal.signal(signal.SIGUSR1, previous)
