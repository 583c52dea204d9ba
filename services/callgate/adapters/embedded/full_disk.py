"""Serving through a disk that refuses writes (ADR 0084).

A round the disk refuses (``storage_failure``: full, past a file-size limit, an I/O error)
rolled back whole; it is tried again after a pause that grows to ``RETRY_MAX_S``, each time
after one small write that must succeed first, so a full disk neither ends ``serve`` nor
keeps a core busy, and work resumes by itself once the disk takes writes again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from callgate.domain.codes import storage_failure

# A round the disk refused is tried again after 0.05 s, 0.1 s, 0.2 s, ... at most
# RETRY_MAX_S apart: the first try after space returns comes within a second.
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0


def retry_delay(attempt: int) -> float:
    """The pause after the ``attempt``-th refused round in a row (1, 2, ...)."""
    return min(RETRY_MAX_S, RETRY_FIRST_S * 2.0 ** min(attempt - 1, 32))


class StorageObserver(Protocol):
    """Hears when the disk refuses ``serve``'s rounds, and when it takes them again."""

    def refused(self, reason: str, attempt: int, retry_in_s: float) -> None: ...

    def resumed(self, attempts: int, seconds: float) -> None: ...


def serve_rounds(
    run_once: Callable[[], int],
    probe_write: Callable[[], None],
    stop: threading.Event,
    idle_sleep_s: float,
    storage: StorageObserver | None,
) -> None:
    """Run rounds until ``stop`` is set, sleeping ``idle_sleep_s`` when one made no
    progress, and waiting out a disk that refuses them (module docstring); ``storage``
    hears of both."""
    refused, since = 0, 0.0
    while not stop.is_set():
        try:
            if refused:
                probe_write()
            progress = run_once()
        except Exception as exc:
            reason = storage_failure(exc)
            if reason is None:
                raise
            refused += 1
            since = since or time.monotonic()
            delay = retry_delay(refused)
            if storage is not None:
                storage.refused(reason, refused, delay)
            stop.wait(delay)
            continue
        if refused and storage is not None:
            storage.resumed(refused, time.monotonic() - since)
        refused, since = 0, 0.0
        if not progress:
            stop.wait(idle_sleep_s)
