"""The notifier: follows the pending view and tells each target of each item that appears
and of each that leaves it; ``build_notifier`` makes it from the configuration.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from callgate.adapters.atomic_file import write_atomically
from callgate.adapters.notify.callbacks import AccessRequestCallbacks
from callgate.adapters.notify.deliveries import Clock, Deliveries, Target
from callgate.adapters.notify.reader import PendingReader
from callgate.adapters.notify.slack import SlackTarget
from callgate.adapters.notify.webhook import WebhookTarget
from callgate.config.sections import NotifySettings, SlackSettings
from callgate.domain.codes import storage_failure
from callgate.domain.notices import (
    ACCESS_REQUEST_DECIDED,
    Notice,
    changes,
    decided_notice,
    pending_notice,
    wanted,
)

log = logging.getLogger("callgate.notify")


# A status whose approval is still "pending" after the item left the pending view is
# read again (the status projection may lag the pending one) for up to this long.
STATUS_WAIT_S = 5.0


class Notifier:
    """Follows the pending view; tells the targets of each item that appears and of each
    that leaves it (its decision from the status view).

    Its position, the items told as pending and not yet as decided, is stored in
    ``position`` after each change: a restarted notifier starts from it, so an item
    decided while it was down is told as decided, and one told before is not told as
    pending again. Without a readable position, everything pending at start is told
    (again): at least once; receivers drop repeats by webhook-id."""

    def __init__(
        self,
        reader: PendingReader,
        targets: Sequence[Target],
        deliveries: Deliveries,
        console_url: str | None,
        interval_s: float = 0.25,
        position: Path | None = None,
        callbacks: AccessRequestCallbacks | None = None,
    ) -> None:
        self.callbacks = callbacks
        self._reader = reader
        self._targets = list(targets)
        self._deliveries = deliveries
        self._console_url = console_url
        self._interval_s = interval_s
        self._position = position
        self._before: dict[str, Mapping[str, Any]] = {}
        self._closing: dict[str, tuple[Mapping[str, Any], float]] = {}
        self._saved: dict[str, Mapping[str, Any]] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="callgate-notify", daemon=True)

    def start(self) -> None:
        self._before = self._saved = self._load()
        self._deliveries.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._deliveries.stop()

    def _load(self) -> dict[str, Mapping[str, Any]]:
        """The stored position, or nothing (everything pending is then told)."""
        if self._position is None or not self._position.exists():
            return {}
        try:
            told = json.loads(self._position.read_text(encoding="utf-8"))["told"]
            if not isinstance(told, dict) or not all(isinstance(r, dict) for r in told.values()):
                raise ValueError("'told' is not an object of rows")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "the notifier's position %s is unreadable (%s): everything pending is told again",
                self._position,
                exc,
            )
            return {}
        return told

    def _save(self) -> None:
        """Store the position (atomically) when it changed: the items told as pending
        whose decision is not yet told, those still in the view and those leaving it."""
        if self._position is None:
            return
        told = {**{inv: row for inv, (row, _) in self._closing.items()}, **self._before}
        if told == self._saved:
            return
        self._position.parent.mkdir(parents=True, exist_ok=True)
        document = json.dumps({"told": told}, ensure_ascii=False).encode()
        write_atomically(self._position, document, 0o644)
        self._saved = told

    def _tell(self, notice: Notice) -> None:
        for target in self._targets:
            if wanted(notice, target.events, target.tenants):
                self._deliveries.submit(target, notice)

    def poll(self) -> None:
        rows = {key: json.loads(value) for key, value in self._reader.view_items_raw("pending")}
        opened, closed = changes(self._before, rows)
        self._before = rows
        for row in opened:
            self._tell(pending_notice(row, self._console_url))
        now = time.monotonic()
        for row in closed:
            self._closing[row["invocation_id"]] = (row, now + STATUS_WAIT_S)
        for inv, (row, until) in list(self._closing.items()):
            status = self._reader.view("status", inv)
            state = ((status or {}).get("approval") or {}).get("state")
            if state in (None, "pending") and now < until:
                continue  # the status view has not caught up yet
            del self._closing[inv]
            self._tell(decided_notice(row, status, self._console_url))
        self._save()
        if self.callbacks is not None:
            self.callbacks.poll()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as exc:
                reason = storage_failure(exc)
                if reason is not None:  # the position stays as stored (ADR 0084)
                    log.warning("storing the notifier's position failed (%s); retrying", reason)
                else:
                    log.warning("reading the pending view failed; retrying", exc_info=True)
                self._stop.wait(1.0)
            self._stop.wait(self._interval_s)


def build_notifier(
    reader: PendingReader,
    notify: NotifySettings,
    slack: SlackSettings,
    state_dir: Path,
    clock: Clock,
) -> Notifier | None:
    """The notifier for the configuration, or None when nobody is to be told."""
    webhooks = [WebhookTarget(w, notify.timeout_s, clock) for w in notify.webhooks]
    targets: list[Target] = list(webhooks)
    if slack.configured and slack.post_messages:
        targets.append(SlackTarget(slack, notify.timeout_s))
    if not targets:
        return None
    dead = notify.dead_letter_file
    deliveries = Deliveries(
        notify.retry_delays_s, dead if dead.is_absolute() else state_dir / dead, clock
    )
    position = notify.position_file
    callbacks = notify.callbacks_file
    return Notifier(
        reader,
        [t for t in targets if not _callbacks_only(t)],
        deliveries,
        notify.console_url,
        position=position if position.is_absolute() else state_dir / position,
        callbacks=AccessRequestCallbacks(
            reader,
            webhooks,
            deliveries,
            callbacks if callbacks.is_absolute() else state_dir / callbacks,
        ),
    )


def _callbacks_only(target: Target) -> bool:
    """A webhook for ARAP callbacks alone is told nothing else."""
    return target.events == frozenset({ACCESS_REQUEST_DECIDED})
