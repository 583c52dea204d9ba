"""The stop signals of a command that runs until stopped (``callgate.stopping``): one sent
during start-up is held for the handlers, never lost to a ``KeyboardInterrupt`` raised
somewhere in start-up code.

Each case runs in a Python process of its own, as the command line does: a signal sent to
a process goes to any of its threads that does not block it, so the hold needs every
thread to block it (the command line holds before it starts any; a test runner has more).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

HOLD_THEN_INSTALL = """
import os, signal, threading, time
from callgate.stopping import held, stop_on_signals
stop = threading.Event()
with held():
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.1)  # unheld, Python would raise KeyboardInterrupt by now
    print("held", stop.is_set(), flush=True)
    {install}
print("stopped", stop.wait(5.0), flush=True)
"""


def run(install: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(HOLD_THEN_INSTALL).format(install=install)
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        preexec_fn=default_sigint,
    )


def default_sigint() -> None:
    """SIGINT as a terminal gives it: a runner started in the background (CI) ignores it,
    the ignored disposition survives exec, and Python then installs no interrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_sigint_during_the_hold_waits_for_the_handlers_installed_in_it() -> None:
    done = run("stop_on_signals(stop)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["held False", "stopped True"], done.stdout


def test_without_handlers_a_held_sigint_is_python_s_interrupt_when_the_hold_ends() -> None:
    done = run("pass")
    assert done.stdout == "held False\n", done.stdout  # nothing after the block ran
    assert "KeyboardInterrupt" in done.stderr
    assert done.returncode == -signal.SIGINT


def test_the_hold_restores_the_signal_mask_it_found() -> None:
    from callgate.stopping import held

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with held():
        assert {signal.SIGTERM, signal.SIGINT} <= signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before


def test_an_exit_held_by_a_thread_ends_within_its_grace_with_the_stacks_said() -> None:
    code = textwrap.dedent("""
        import threading
        from callgate.stopping import exit_within
        threading.Thread(target=threading.Event().wait, name="holds-the-exit").start()
        exit_within(0, grace_s=0.5)
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "exiting took over 0.5 s after stopping" in done.stderr
    assert "in wait" in done.stderr  # the holding thread's stack, where it waits
