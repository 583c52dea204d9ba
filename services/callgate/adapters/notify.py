"""Telling approvers (ADR 0032): the consumer of the pending view, and its deliveries to
webhooks (Standard Webhooks, via the ``standardwebhooks`` library) and Slack
(``slack_sdk``), retried with backoff and dead-lettered to a JSON-lines file.

Wired by the composition root into ``callgate serve --http``. What to tell is decided by
the pure ``callgate.domain.notices``; this module reads the views, sends, waits, retries
and writes dead letters. ``SlackInteractions`` verifies Slack's request signatures and
maps a Slack user to the callgate identity configured for them; the decision itself goes
through the same approval API as the console's (``Gateway.approve``/``deny``).
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import SignatureVerifier
from standardwebhooks.webhooks import Webhook

from callgate.adapters.atomic_file import write_atomically
from callgate.config.sections import NotifySettings, SlackSettings, SlackUser, WebhookSettings
from callgate.domain.access_requests import (
    CALLBACK_EVENTS,
    TERMINAL_STATUSES,
    approval_result,
    task_status,
)
from callgate.domain.approvals import peek_claim
from callgate.domain.codes import Code, Rejection, storage_failure
from callgate.domain.identity import SessionIssuer
from callgate.domain.notices import (
    ACCESS_REQUEST_DECIDED,
    DECIDED,
    PENDING,
    Notice,
    SlackAction,
    changes,
    decided_notice,
    pending_notice,
    retry_due,
    slack_decided,
    slack_pending,
    wanted,
)

log = logging.getLogger("callgate.notify")
Clock = Callable[[], int]
# A status whose approval is still "pending" after the item left the pending view is
# read again (the status projection may lag the pending one) for up to this long.
STATUS_WAIT_S = 5.0


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


class WebhookTarget:
    """POSTs the notice to one endpoint, signed per Standard Webhooks."""

    def __init__(self, conf: WebhookSettings, timeout_s: float, clock: Clock) -> None:
        self.name = conf.url
        self.events: frozenset[str] = frozenset(conf.events)
        self.tenants = frozenset(conf.tenants)
        self._url = conf.url
        self._webhook = Webhook(conf.secret)
        self._timeout = timeout_s
        self._clock = clock

    def send(self, notice: Notice) -> None:
        now = self._clock()
        payload = notice.payload(now)
        at = datetime.fromtimestamp(now // 1000, UTC)
        headers = {
            "content-type": "application/json",
            "webhook-id": notice.message_id,
            "webhook-timestamp": str(now // 1000),
            "webhook-signature": self._webhook.sign(notice.message_id, at, payload),
        }
        try:
            response = httpx.post(
                self._url, content=payload.encode(), headers=headers, timeout=self._timeout
            )
        except httpx.HTTPError as exc:
            raise DeliveryError(str(exc) or type(exc).__name__) from None
        if not 200 <= response.status_code < 300:
            raise DeliveryError(f"HTTP {response.status_code}")


class SlackTarget:
    """Posts an interactive message per pending item; replaces it once it is decided."""

    name = "slack"
    events: frozenset[str] = frozenset({PENDING, DECIDED})
    tenants: frozenset[str] = frozenset()  # each tenant's channel: ``_channel_of``

    def __init__(self, conf: SlackSettings, timeout_s: float) -> None:
        base = conf.api_url if conf.api_url.endswith("/") else conf.api_url + "/"
        self._client = WebClient(token=conf.bot_token, base_url=base, timeout=int(timeout_s))
        self._channel = conf.channel
        self._tenant_channels = dict(conf.tenant_channels)
        self._posted: dict[str, tuple[str, str]] = {}  # invocation -> (channel, ts)
        self._lock = threading.Lock()

    def _channel_of(self, tenant: str) -> str | None:
        return self._tenant_channels.get(tenant, self._channel)

    def send(self, notice: Notice) -> None:
        with self._lock:
            posted = self._posted.get(notice.invocation_id)
        try:
            if notice.kind == PENDING:
                channel = self._channel_of(notice.tenant)
                if channel is None:
                    return  # no channel for this tenant: Slack is not told
                text, blocks = slack_pending(notice)
                answer = self._client.chat_postMessage(channel=channel, text=text, blocks=blocks)
                with self._lock:
                    self._posted[notice.invocation_id] = (
                        str(answer.get("channel") or channel),
                        str(answer.get("ts")),
                    )
                return
            text, blocks = slack_decided(notice)
            if posted is not None:
                self._client.chat_update(channel=posted[0], ts=posted[1], text=text, blocks=blocks)
                with self._lock:
                    self._posted.pop(notice.invocation_id, None)
            elif (channel := self._channel_of(notice.tenant)) is not None:
                self._client.chat_postMessage(channel=channel, text=text, blocks=blocks)
        except SlackApiError as exc:
            raise DeliveryError(f"Slack answered {exc.response.get('error')!r}") from None


@dataclass(frozen=True)
class CallbackNotice(Notice):
    """An ARAP callback (ADR 0090): the body is the profile's notification itself
    (``state``, ``task``, ``result``), signed per Standard Webhooks like every notice."""

    def payload(self, at_ms: int) -> str:
        return json.dumps(self.data, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


class PendingReader(Protocol):
    def view_items_raw(self, view: str) -> list[tuple[str, str]]: ...

    def view(self, view: str, key: str) -> dict[str, Any] | None: ...


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


# --- Slack interactions ---------------------------------------------------------------------

# Slack's own limit: a request older (or newer) than this is refused (replay protection).
SLACK_MAX_AGE_S = 300
SLACK_TOKEN_TTL_S = 120


class SlackInteractions:
    """Verifies an interaction request as Slack signs it and names the callgate identity
    its clicking user acts as. Decides nothing: callgate's approval checks do."""

    def __init__(self, conf: SlackSettings, issuer: SessionIssuer, clock: Clock) -> None:
        assert conf.signing_secret is not None
        self._verifier = SignatureVerifier(conf.signing_secret)
        self._users: Mapping[str, SlackUser] = {u.slack_user: u for u in conf.users}
        self._team = conf.team_id
        self._issuer = issuer
        self._clock = clock

    def verify(self, body: bytes, timestamp: str | None, signature: str | None) -> None:
        """Raise ``Rejection(UNAUTHENTICATED)`` unless Slack signed ``body`` recently."""
        if not timestamp or not signature:
            raise Rejection(Code.UNAUTHENTICATED, "a Slack request needs its signature headers")
        try:
            age = abs(self._clock() / 1000 - int(timestamp))
        except ValueError:
            raise Rejection(
                Code.UNAUTHENTICATED, "X-Slack-Request-Timestamp is not a number"
            ) from None
        if age > SLACK_MAX_AGE_S:
            raise Rejection(
                Code.UNAUTHENTICATED, f"the Slack request timestamp is {int(age)} s old (over 300)"
            )
        try:  # Slack sends UTF-8; ``slack_sdk`` would raise on anything else
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise Rejection(Code.INVALID_REQUEST, "the Slack request body is not UTF-8") from None
        if not self._verifier.is_valid(text, timestamp, signature):
            raise Rejection(Code.UNAUTHENTICATED, "the Slack request signature does not verify")

    def session_for(self, action: SlackAction) -> tuple[SlackUser, str]:
        """The mapped identity and a short-lived session token of it (issuer
        ``callgate-slack``), or ``Rejection(APPROVER_FORBIDDEN)`` for an unmapped user."""
        if self._team is not None and action.team != self._team:
            raise Rejection(Code.APPROVER_FORBIDDEN, "the Slack request comes from another team")
        user = self._users.get(action.slack_user)  # exact: a Slack user id, as configured
        if user is None:
            raise Rejection(
                Code.APPROVER_FORBIDDEN,
                f"Slack user {action.slack_user} is not mapped to a callgate identity",
            )
        token = self._issuer.issue(
            user.user, user.tenant, list(user.roles), self._clock(), ttl_seconds=SLACK_TOKEN_TTL_S
        )
        return user, token
