"""One SDK client used from two threads on the embedded backend (docs/how-to/wait-for-approval.md
approves from a timer thread while the main thread waits).

The runner lock belongs to the process: a second thread that ran the runner while the first
did would release the lock under it (``RunnerLockNotHeld``). One thread runs the runner; the
others wait for its work as they would for a server's.
"""

from __future__ import annotations

import threading
from pathlib import Path

from callgate.adapters.embedded.backend import EmbeddedBackend
from callgate.bootstrap import Settings
from callgate.surfaces.sdk import connect


def test_a_second_thread_waits_while_the_first_runs_the_runner(tmp_path: Path) -> None:
    gate = connect(Settings(state_dir=tmp_path, dev=True))
    backend = gate.backend
    assert isinstance(backend, EmbeddedBackend)
    running = threading.Event()
    second_done = threading.Event()
    errors: list[BaseException] = []

    after: list[bool] = []

    def first_until_second_is_done() -> bool:
        if backend.runner.holds_lock:
            running.set()  # called inside run_until: this thread runs the runner
        if second_done.is_set():
            after.append(True)
        return len(after) > 1  # one more round once the second thread is done

    def second() -> None:
        try:
            assert running.wait(10)
            asked = iter([False, False, True])  # not done at first: it must wait
            assert backend.wait(lambda: next(asked, True), 10)
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)
        finally:
            second_done.set()

    other = threading.Thread(target=second)
    other.start()
    try:
        assert backend.wait(first_until_second_is_done, 20)  # before: RunnerLockNotHeld
    finally:
        other.join(20)
        gate.close()
    assert not errors, errors
