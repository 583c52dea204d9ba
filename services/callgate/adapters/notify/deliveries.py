"""Deliveries of notices, in due order on one thread: a failed one is retried with backoff
and, after the last attempt, written to a JSON-lines dead-letter file. Apart from the
channels because every channel's notice is retried and dead-lettered the same way.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from callgate.domain.notices import (
    Notice,
    retry_due,
)

log = logging.getLogger("callgate.notify")
Clock = Callable[[], int]


class DeliveryError(Exception):
    """One attempt failed (the message says how); the delivery is retried."""


class Target(Protocol):
    name: str
    events: frozenset[str]
    tenants: frozenset[str]  # empty: every tenant

    def send(self, notice: Notice) -> None:
        """Deliver once; raise ``DeliveryError`` (or any exception) on failure."""
        ...


@dataclass(order=True)
class _Job:
    due: float
    seq: int
    target: Target = field(compare=False)
    notice: Notice = field(compare=False)
    attempt: int = field(default=1, compare=False)


class Deliveries:
    """One thread sends every delivery in due order; a failed one is retried after
    ``delays_s[n]`` and, after the last, appended to ``dead_letters`` (JSON lines)."""

    def __init__(self, delays_s: Sequence[float], dead_letters: Path, clock: Clock) -> None:
        self._delays = tuple(delays_s)
        self._dead = dead_letters
        self._clock = clock
        self._heap: list[_Job] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="callgate-notify-send", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, target: Target, notice: Notice) -> None:
        with self._cv:
            heapq.heappush(self._heap, _Job(time.monotonic(), next(self._seq), target, notice))
            self._cv.notify()

    def stop(self) -> None:
        """Stop; deliveries still waiting for a retry become dead letters, not lost."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._cv:
            left, self._heap = self._heap, []
        for job in left:
            self._dead_letter(job, "callgate stopped before the delivery succeeded")

    def _next(self) -> _Job | None:
        with self._cv:
            while not self._stopping:
                if self._heap and self._heap[0].due <= time.monotonic():
                    return heapq.heappop(self._heap)
                wait = self._heap[0].due - time.monotonic() if self._heap else None
                self._cv.wait(wait)
            return None

    def _run(self) -> None:
        while (job := self._next()) is not None:
            try:
                job.target.send(job.notice)
            except Exception as exc:
                self._failed(job, f"{type(exc).__name__}: {exc}")

    def _failed(self, job: _Job, error: str) -> None:
        delay = retry_due(job.attempt, self._delays)
        where = f"{job.notice.kind} {job.notice.invocation_id} to {job.target.name}"
        if delay is None:
            log.error("giving up on %s after %d attempts: %s", where, job.attempt, error)
            self._dead_letter(job, error)
            return
        log.warning("delivery %s failed (attempt %d): %s", where, job.attempt, error)
        with self._cv:
            job.due, job.attempt = time.monotonic() + delay, job.attempt + 1
            heapq.heappush(self._heap, job)
            self._cv.notify()

    def _dead_letter(self, job: _Job, error: str) -> None:
        now = self._clock()
        record = {
            "at": datetime.fromtimestamp(now / 1000, UTC).isoformat(timespec="milliseconds"),
            "target": job.target.name,
            "message_id": job.notice.message_id,
            "type": job.notice.kind,
            "invocation_id": job.notice.invocation_id,
            "tenant": job.notice.tenant,
            "attempts": job.attempt,
            "error": error,
            "data": job.notice.data,
        }
        self._dead.parent.mkdir(parents=True, exist_ok=True)
        with self._dead.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n")
