"""The stop signals of a command that runs until stopped (``callgate.stopping``): one sent
during start-up is held for the handlers, never lost to a ``KeyboardInterrupt`` raised
somewhere in start-up code."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from callgate.stopping import held, stop_on_signals


def test_a_sigint_during_the_hold_waits_for_the_handlers_installed_in_it() -> None:
    stop = threading.Event()
    previous = signal.getsignal(signal.SIGINT)
    try:
        with held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # unheld, Python would raise KeyboardInterrupt by now
            assert not stop.is_set()
            stop_on_signals(stop, signals=(signal.SIGINT,))
        assert stop.wait(5.0)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_without_handlers_a_held_sigint_is_python_s_interrupt_when_the_hold_ends() -> None:
    reached_end_of_block = False
    with pytest.raises(KeyboardInterrupt), held():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        reached_end_of_block = True
    assert reached_end_of_block


def test_the_hold_restores_the_signal_mask_it_found() -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with held():
        assert {signal.SIGTERM, signal.SIGINT} <= signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
