"""Stopping on SIGTERM and SIGINT without taking a lock in a signal handler.

A Python signal handler runs in the main thread between two bytecodes, possibly while that
thread holds a lock: ``threading.Event.set`` from the handler then waits forever on the
lock of the ``Event`` the main thread is inside ``wait`` of (``serve`` hung after SIGTERM
once in 33 stops). Here the handler only writes a byte to a pipe, which takes no lock; a
thread of its own reads the pipe and sets the ``Event``.

A command that runs until stopped holds the stop signals from its first line until its
handlers are installed (``held``): a signal sent during start-up then waits for them.
Without the hold, a SIGINT in that window raised Python's ``KeyboardInterrupt`` wherever
start-up code was, and one was lost there once in about 200 stops (serve then ran on).
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Block the stop signals in this thread (and the threads it starts) until the block
    ends; one that arrives meanwhile is delivered then, to the handlers installed by then.
    Start no process inside the block: a child would inherit the blocked signals."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def stop_on_signals(stop: threading.Event, signals: Iterable[int] = STOP_SIGNALS) -> None:
    """Set ``stop`` when one of ``signals`` arrives (main thread only, as ``signal.signal``)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)

    def on_signal(signum: int, frame: object) -> None:
        with contextlib.suppress(BlockingIOError):  # full: a stop is already on its way
            os.write(write_end, bytes([signum & 0xFF]))

    def relay() -> None:
        while os.read(read_end, 1):
            stop.set()

    threading.Thread(target=relay, name="callgate-stop-signals", daemon=True).start()
    for sig in signals:
        signal.signal(sig, on_signal)


# How long the interpreter's own exit (its threads, ``atexit``) may take once a command
# that ran until stopped has finished and said so.
EXIT_GRACE_S = 3.0


def exit_within(code: int, grace_s: float = EXIT_GRACE_S) -> None:
    """Bound the exit of a process whose command ran until stopped: past ``grace_s`` the
    stacks of every thread go to stderr (what held the exit) and the process ends with
    ``code``; a stop must end the process whatever holds it. A C-level timer two seconds
    later ends it (status 1) should the interpreter no longer run threads by then."""

    def end() -> None:
        time.sleep(grace_s)  # a daemon thread: gone if the exit finishes first
        sys.stderr.write(f"callgate: exiting took over {grace_s:g} s after stopping:\n")
        faulthandler.dump_traceback(all_threads=True)
        os._exit(code)

    threading.Thread(target=end, name="callgate-exit", daemon=True).start()
    faulthandler.dump_traceback_later(grace_s + 2.0, exit=True)
