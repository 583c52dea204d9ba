"""The runner lock's file, and a probe of it that needs none of the runner's imports.

A client whose state directory is served by ``callgate serve`` only appends and polls: it
asks here whether another process holds the lock before it builds a runner (the deciders,
the executor and the projections), which would cost it most of its start-up for nothing.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "runner.lock"


def held_elsewhere(state_dir: Path) -> bool:
    """Whether another open file holds ``<state_dir>/runner.lock`` now (a running server,
    or another client running the processes). Only a hint: the lock may change hands right
    after; ``EmbeddedRunner.try_acquire`` is what decides. False when the file cannot be
    opened: the runner then meets the same error where it is reported today."""
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
