"""The loops that drive an embedded runner's rounds: until idle, until a condition holds,
until stopped.

Apart from the runner because none of them touches the store's transactions: each only
repeats ``run_once`` (the round and its commit sequence) and decides when to stop or wait.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable

from callgate.adapters.embedded.full_disk import StorageObserver, serve_rounds
from callgate.adapters.embedded.store import EmbeddedStore


class RoundLoops(ABC):
    """Loops over ``run_once`` (a round; returns the progress made) for a runner of
    ``store``."""

    store: EmbeddedStore

    @abstractmethod
    def run_once(self) -> int:
        """One round and its commit; the steps it made (0: nothing to do)."""

    def run_until_idle(self, max_seconds: float = 30.0) -> int:
        """Run rounds until one makes no progress; raises TimeoutError past ``max_seconds``."""
        deadline = time.monotonic() + max_seconds
        total = 0
        while progress := self.run_once():
            total += progress
            if time.monotonic() > deadline:
                raise TimeoutError(f"still busy after {max_seconds}s ({total} steps)")
        return total

    def run_until(
        self, predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.01
    ) -> bool:
        """Run rounds until ``predicate()`` holds (True) or ``timeout_s`` passes (False)."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() > deadline:
                return False
            if not self.run_once():
                time.sleep(poll_s)
        return True

    def serve(
        self,
        stop: threading.Event,
        idle_sleep_s: float = 0.02,
        storage: StorageObserver | None = None,
    ) -> None:
        """Run rounds until ``stop`` is set, sleeping briefly when there is nothing to do,
        and waiting out a disk that refuses them (``full_disk``, ADR 0084)."""
        serve_rounds(self.run_once, self.store.probe_write, stop, idle_sleep_s, storage)
