"""Who may run processes over a state directory: one runner at a time.

The executor calls providers, and two runners would both reconcile one execution. The
guard is an OS file lock on ``<state_dir>/runner.lock`` that the kernel drops when its
holder dies. The store remembers whether the previous holder stopped cleanly (``dirty``):
only after an unclean stop (crash, kill -9, an error) must the next holder ``recover``.
A clean stop leaves no started-but-unfinished work: ``follow_up`` completes before
control returns.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from callgate.adapters.embedded.store import EmbeddedStore

LOCK_FILE = "runner.lock"


def held_elsewhere(state_dir: Path) -> bool:
    """Whether another open file holds ``<state_dir>/runner.lock`` now (a running server,
    or another client running the processes): a client that sees one only appends and
    polls, and never builds a runner. Only a hint: the lock may change hands right after;
    ``Ownership.take`` is what decides. False when the file cannot be opened: the runner
    then meets the same error where it is reported."""
    try:
        fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the probe's lock, if it got it
    return False


class RunnerLockNotHeld(RuntimeError):
    """A runner tried to execute processes without holding the state directory's lock."""


class Ownership:
    """The lock on one store's state directory, whether its last holder left it clean, and
    what the holder owes the store before new work (``ready``)."""

    __slots__ = ("_fd", "failed", "must_recover", "recovered", "store")

    def __init__(self, store: EmbeddedStore) -> None:
        self.store = store
        self._fd: int | None = None
        # ``recover`` before new work: the previous holder stopped uncleanly, or work this
        # holder started may be unfinished (``unfinished``).
        self.must_recover = True
        self.recovered = False
        self.failed = False  # this holder failed: ``release`` leaves the store marked dirty

    @property
    def held(self) -> bool:
        return self._fd is not None

    def take(self) -> bool | None:
        """Take the lock without waiting: ``None`` when another runner has it, else whether
        the previous holder stopped uncleanly (the new holder must recover first). Marks
        the store dirty until ``give_up``."""
        fd = os.open(self.store.state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            with self.store.transaction() as tx:
                dirty = tx.meta("dirty") != "0"
                tx.set_meta("dirty", "1")
        except BaseException:
            os.close(fd)  # a disk that refuses the write (ADR 0084): the lock is not held
            raise
        self._fd = fd
        return dirty

    def try_take(self) -> bool:
        """``take``; False when another runner has the lock."""
        dirty = self.take()
        if dirty is None:
            return False
        self.must_recover, self.failed = dirty, False
        return True

    def release(self) -> None:
        """``give_up``, clean unless this holder failed; the next holder recovers first."""
        try:
            self.give_up(clean=not self.failed)
        finally:
            self.recovered = False

    def ready(self, recover: Callable[[], object]) -> None:
        """Check the lock is held and, the first time after taking it, ``recover`` when
        owed."""
        self.check()
        if not self.recovered:
            if self.must_recover:
                recover()
            self.recovered = True

    def unfinished(self) -> None:
        """Work started may be unfinished (a provider called, its outcome not written):
        before new input, ``recover`` finds it, as after a restart."""
        self.recovered = False
        self.must_recover = True

    def give_up(self, clean: bool) -> None:
        """Release the lock, marking the store clean when ``clean``; a refused write leaves
        it marked dirty, and the next holder recovers."""
        if self._fd is None:
            return
        try:
            if clean:
                with self.store.transaction() as tx:
                    tx.set_meta("dirty", "0")
        finally:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def check(self) -> None:
        if self._fd is None:
            raise RunnerLockNotHeld(f"{self.store.state_dir / LOCK_FILE} is not held")


def wait_for(try_take: Callable[[], bool], timeout: float) -> bool:
    """Poll ``try_take`` for up to ``timeout`` seconds (flock has no timeout)."""
    deadline = time.monotonic() + timeout
    while not try_take():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
