"""The input positions of a Kafka runner's no-op cycles, held for a later commit.

A cycle that emitted nothing and changed no state (most cycles of the pending and decisions
projections, many of the executor's) does not commit on its own: its input positions go with
the next transaction, or are committed by the first cycle ``NOOP_COMMIT_DELAY_S`` after the
oldest of them. Not when the runner falls idle: between two calls at low load it is idle
after nearly every record, and those offsets-only transactions were more than a quarter of a
deployment's transactions at 20 proposals/s (docs/benchmarks.md, "Broker work per
proposal"). Exactly-once holds: every commit carries all deferred positions, so an
uncommitted deferred record was handled against the state that is still the committed one,
and handling it again after a rewind is again a no-op.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

NOOP_COMMIT_DELAY_S = 0.5

Positions = Mapping[tuple[str, int], int]  # (topic, partition) -> next offset


class DeferredPositions:
    """Positions consumed by no-op cycles and not committed yet, and since when."""

    def __init__(self, delay_s: float = NOOP_COMMIT_DELAY_S) -> None:
        self._delay_s = delay_s
        self._held: dict[tuple[str, int], int] = {}
        self._since = 0.0  # time.monotonic() of the oldest held position

    def hold(self, positions: Positions) -> bool:
        """Hold a no-op cycle's ``positions``; True when what is held is due for a commit of
        its own (some is, and the oldest was held ``delay_s`` ago)."""
        if positions and not self._held:
            self._since = time.monotonic()
        self._held.update(positions)
        return bool(self._held) and time.monotonic() - self._since >= self._delay_s

    def with_(self, positions: Positions) -> dict[tuple[str, int], int]:
        """What a commit with ``positions`` commits: every held position, then those."""
        return {**self._held, **positions}

    def clear(self) -> None:
        """After a commit, or a rewind to the committed positions (re-read: no-ops again)."""
        self._held.clear()
