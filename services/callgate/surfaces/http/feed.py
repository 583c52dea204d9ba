"""The pending-approval feed behind ``GET /v1/pending/events``.

One thread per server reads the pending view (the store's projection on embedded, the
in-memory table the server tails on Kafka) a few times a second and bumps ``version``
when its content changed; every event stream compares versions in memory. So the number
of open consoles does not multiply the reads of the view.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from callgate.application.ports import Backend

log = logging.getLogger("callgate.http")


class PendingFeed:
    def __init__(self, backend: Backend, interval_s: float = 0.2) -> None:
        self._backend = backend
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._raw: list[tuple[str, str]] = []
        self._rows: list[dict[str, Any]] = []
        self._version = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="callgate-pending-feed", daemon=True)
        # Called with each row that left the view (approved, denied or expired): the
        # approval-wait metric (``ApiMetrics.approval_closed``).
        self.on_closed: Callable[[dict[str, Any]], None] | None = None

    @property
    def version(self) -> int:
        return self._version

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._rows)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def refresh(self) -> None:
        raw = self._backend.view_items_raw("pending")
        if raw == self._raw:
            return
        rows = [json.loads(value) for _, value in raw]
        rows.sort(key=lambda r: (r.get("requested_at", 0), r.get("invocation_id", "")))
        with self._lock:
            before = self._rows
            self._raw, self._rows = raw, rows
            self._version += 1
        if self.on_closed is not None:
            still = {r.get("invocation_id") for r in rows}
            for row in before:
                if row.get("invocation_id") not in still:
                    self.on_closed(row)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception:  # retried; the streams keep the last state meanwhile
                log.warning("reading the pending view failed; retrying", exc_info=True)
                self._stop.wait(1.0)
            self._stop.wait(self._interval_s)
