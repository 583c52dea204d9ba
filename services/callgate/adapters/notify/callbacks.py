"""ARAP callbacks (ADR 0090): a task's decision told to the webhook its PEP registered."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from callgate.adapters.atomic_file import write_atomically
from callgate.adapters.notify.deliveries import Deliveries
from callgate.adapters.notify.reader import PendingReader
from callgate.adapters.notify.webhook import WebhookTarget
from callgate.domain.access_requests import (
    CALLBACK_EVENTS,
    TERMINAL_STATUSES,
    approval_result,
    task_status,
)
from callgate.domain.approvals import peek_claim
from callgate.domain.notices import (
    ACCESS_REQUEST_DECIDED,
    Notice,
)

log = logging.getLogger("callgate.notify")


@dataclass(frozen=True)
class CallbackNotice(Notice):
    """An ARAP callback (ADR 0090): the body is the profile's notification itself
    (``state``, ``task``, ``result``), signed per Standard Webhooks like every notice."""

    def payload(self, at_ms: int) -> str:
        return json.dumps(self.data, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


class AccessRequestCallbacks:
    """ARAP callbacks (ADR 0090): the tasks whose PEP asked to be told, and to which
    registered webhook. A callback goes only to a webhook of the configuration (its URL
    exactly, subscribed to ``access_request.decided`` and to the task's tenant): the
    profile's pre-registered endpoint, so no PEP makes callgate post anywhere else, and
    each notification is signed with that webhook's secret. Registrations are kept in
    ``position`` (JSON, atomically) until the task is terminal and its notification handed
    to the deliveries (retried, then dead-lettered): a restart keeps them."""

    def __init__(
        self,
        reader: PendingReader,
        targets: Sequence[WebhookTarget],
        deliveries: Deliveries,
        position: Path | None = None,
    ) -> None:
        self._reader = reader
        self._targets = [t for t in targets if ACCESS_REQUEST_DECIDED in t.events]
        self._deliveries = deliveries
        self._position = position
        self._lock = threading.Lock()
        self._waiting: dict[str, dict[str, Any]] = self._load()

    def target_for(self, endpoint: str, tenant: str) -> WebhookTarget | None:
        """The registered webhook at exactly ``endpoint`` for ``tenant``, or None."""
        for target in self._targets:
            if target.name == endpoint and (not target.tenants or tenant in target.tenants):
                return target
        return None

    def register(self, task: Mapping[str, Any], tenant: str, callback: Mapping[str, Any]) -> None:
        """Tell ``callback["endpoint"]`` when ``task`` is terminal (``task`` as answered:
        ``id``, ``status_endpoint``; ``callback``: ``endpoint``, ``state``, ``events``)."""
        entry = {
            "tenant": tenant,
            "endpoint": callback["endpoint"],
            "state": callback.get("state"),
            "events": sorted(callback.get("events") or CALLBACK_EVENTS),
            "status_endpoint": task["status_endpoint"],
        }
        with self._lock:
            self._waiting[str(task["id"])] = entry
            self._save()

    def poll(self) -> None:
        """Hand the notification of each task that became terminal to the deliveries."""
        with self._lock:
            done: list[str] = []
            for task_id, entry in self._waiting.items():
                status = self._reader.view("status", task_id)
                state = task_status(status) if status is not None else None
                if state not in TERMINAL_STATUSES:
                    continue
                done.append(task_id)
                target = self.target_for(entry["endpoint"], entry["tenant"])
                if target is None or state not in entry["events"]:
                    continue  # the webhook left the configuration, or the event is unwanted
                assert status is not None
                self._deliveries.submit(target, _callback(task_id, state, status, entry))
            for task_id in done:
                del self._waiting[task_id]
            if done:
                self._save()

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._position is None or not self._position.exists():
            return {}
        try:
            waiting = json.loads(self._position.read_text(encoding="utf-8"))["waiting"]
            if not isinstance(waiting, dict):
                raise ValueError("'waiting' is not an object")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("the ARAP callbacks %s are unreadable (%s)", self._position, exc)
            return {}
        return waiting

    def _save(self) -> None:
        if self._position is None:
            return
        self._position.parent.mkdir(parents=True, exist_ok=True)
        document = json.dumps({"waiting": self._waiting}, ensure_ascii=False).encode()
        write_atomically(self._position, document, 0o600)


def _callback(
    task_id: str, state: str, status: Mapping[str, Any], entry: Mapping[str, Any]
) -> CallbackNotice:
    """The profile's callback body; an approved task carries its ``reevaluate`` result."""
    data: dict[str, Any] = {
        "task": {"id": task_id, "status": state, "status_endpoint": entry["status_endpoint"]}
    }
    if entry.get("state") is not None:
        data["state"] = entry["state"]
    artifact = (status.get("approval") or {}).get("approval_id")
    jti = peek_claim(artifact, "jti") if isinstance(artifact, str) else None
    result = approval_result(status, jti) if jti is not None else None
    if result is not None:
        data["result"] = result
    return CallbackNotice(ACCESS_REQUEST_DECIDED, task_id, str(entry["tenant"]), data)
