"""A bound on every blocking Kafka client call of a worker (docs/contract.md, "Kafka client
errors").

librdkafka does not always keep the timeout it is given: after a broker restart that
loses a group coordinator, ``send_offsets_to_transaction`` can wait forever
(confluentinc/librdkafka#5456: the coordinator request's timeout is never checked; #5511: a
decommissioned coordinator is never looked up again). A call blocked inside the C client
cannot be interrupted from Python, so a worker stuck in one is ended: its supervisor starts
it again, the new producer fences the old ``transactional.id`` (the coordinator aborts its
open transaction) and the state is restored from the committed changelog. Nothing committed
is lost and nothing uncommitted is kept, so ending the process is safe by construction.

``Watchdog.bounded(step, bound_s)`` marks a blocking call; a daemon thread checks the marks
and calls ``on_stall(step, waited_s)`` once a call outlives its bound. The thread takes no
lock that the blocked thread may hold (``on_stall`` logs and exits the process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# The timeout handed to each blocking client call, and how much longer the watchdog lets it
# run before the worker is ended: a call that keeps its timeout returns (or raises) well
# within its bound. Both stay below ``runner.TRANSACTION_TIMEOUT_MS`` plus a restart, so a
# wedged worker is replaced before a caller's usual wait (30 s) runs out.
CALL_TIMEOUT_S = 10.0
STALL_GRACE_S = 5.0
CHECK_EVERY_S = 0.5


class Watchdog:
    """Ends a worker whose blocking client call outlives its bound."""

    def __init__(
        self,
        on_stall: Callable[[str, float], None],
        clock: Callable[[], float] = time.monotonic,
        check_every_s: float = CHECK_EVERY_S,
    ) -> None:
        self._on_stall = on_stall
        self._clock = clock
        self._check_every_s = check_every_s
        # (step, started, deadline) of the call in progress; replaced whole (one reference
        # assignment is atomic), so the checking thread needs no lock.
        self._current: tuple[str, float, float] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.fired: str | None = None

    @contextmanager
    def bounded(self, step: str, bound_s: float = CALL_TIMEOUT_S + STALL_GRACE_S) -> Iterator[None]:
        """Mark the blocking call ``step`` for as long as the block runs."""
        now = self._clock()
        outer = self._current
        self._current = (step, now, now + bound_s)
        try:
            yield
        finally:
            self._current = outer

    def check(self) -> str | None:
        """The step past its bound (and tell ``on_stall``, once), or None."""
        current = self._current
        if current is None or self.fired is not None:
            return None
        step, started, deadline = current
        now = self._clock()
        if now <= deadline:
            return None
        self.fired = step
        self._on_stall(step, now - started)
        return step

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="callgate-watchdog", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._check_every_s):
            self.check()
