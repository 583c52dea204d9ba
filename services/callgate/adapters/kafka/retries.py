"""A Kafka runner's consecutive failed attempts: the back-off between them, the bound on
their number, and since when the runner has made no progress.

Kept with the runner's clock of the stall, not the worker's: a runner that gives up is
restarted (``worker``) and told when the stall began, so the first commit after it can say
how long work stopped, however many restarts that took.
"""

from __future__ import annotations

import time


class Retries:
    """``max_retries`` failed attempts in a row are borne; ``stalled_since``
    (``time.time()``): progress stopped then, before this runner started."""

    def __init__(self, max_retries: int, stalled_since: float | None = None) -> None:
        self._max_retries = max_retries
        self._failures = 0
        self._stalled_since = stalled_since

    def failed(self) -> bool:
        """Count a failed attempt; False when it is one past ``max_retries`` in a row."""
        self._failures += 1
        if self._stalled_since is None:
            self._stalled_since = time.time()
        return self._failures <= self._max_retries

    def back_off(self) -> None:
        """Wait before the next attempt, longer after each failure (at most 5 s)."""
        time.sleep(min(5.0, 0.05 * 2**self._failures))

    def succeeded(self) -> None:
        """A whole cycle went through: the next failure is the first in a row."""
        self._failures = 0

    def resumed(self) -> float | None:
        """On a commit: the seconds since progress stopped, when it had (once)."""
        since, self._stalled_since = self._stalled_since, None
        return None if since is None else time.time() - since
