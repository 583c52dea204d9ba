"""Consumed requests pruned from the embedded log once older than the retention.

Requests hold bearer tokens (ADR 0016): once every reader of the ``requests`` topic has
consumed one and the retention has passed, the log keeps no copy of it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from callgate.adapters.embedded.store import EmbeddedStore
from callgate.domain.process_port import Process

PRUNE_REQUESTS_EVERY_S = 60.0


class RequestRetention:
    """Prunes ``store``'s consumed requests older than ``retention_ms`` (None: keeps them)."""

    def __init__(
        self, store: EmbeddedStore, processes: Sequence[Process[Any]], retention_ms: int | None
    ) -> None:
        self._store = store
        self._retention_ms = retention_ms
        self._readers = [p.name for p in processes if "requests" in p.inputs]
        self._next_prune = 0.0

    def prune(self) -> None:
        """Drop the requests every reader consumed that are older than the retention: at
        most every ``PRUNE_REQUESTS_EVERY_S``, or a tenth of the retention when that is
        shorter (every round for a retention of 0)."""
        retention = self._retention_ms
        if retention is None or time.monotonic() < self._next_prune:
            return
        self._next_prune = time.monotonic() + min(PRUNE_REQUESTS_EVERY_S, retention / 10_000)
        self._store.prune_requests(self._readers, retention)
