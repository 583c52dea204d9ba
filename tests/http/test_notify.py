"""Approvers are told: Standard Webhooks deliveries and Slack, end to end over loopback.

``callgate serve --http`` (embedded, development mode for the agents' tokens) is
configured with two webhook endpoints, real HTTP servers on loopback (one answers 200
and checks nothing itself; the other always answers 500), and Slack, whose API base
URL is a third loopback server standing in for slack.com's ``chat.postMessage`` and
``chat.update``. The tests verify every delivery's signature with the
``standardwebhooks`` library, and drive ``POST /v1/slack/interactions`` with payloads
signed the way Slack signs them (``slack_sdk``'s ``SignatureVerifier``).
"""

from __future__ import annotations

import base64
import hmac
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote_from_bytes, urlencode

import httpx
import pytest
from slack_sdk.signature import SignatureVerifier
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from callgate.adapters.keyfiles import generate_key_pair
from tests.http.approval_flow import (
    callgate,
    effects_of,
    refund_waited_on_runs_once_approved,
    value_of,
)
from tests.http_support import HOSTILE_JSON, REFUND_BIG, HttpServe, wait_until

SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TEAM = "T0ACME"
RETRIES = (0.2, 0.4)


class Recorder:
    """A loopback HTTP server that records every request and answers ``status``."""

    def __init__(self, status: int = 200, answer: Any = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with recorder.lock:
                    recorder.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body}
                    )
                out = json.dumps(answer(self.path) if callable(answer) else {}).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def seen(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.requests)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def slack_answer(path: str) -> dict[str, Any]:
    return {"ok": True, "channel": "C0APPROVALS", "ts": "1700000000.000100"}


def secret() -> str:
    return "whsec_" + base64.b64encode(os.urandom(24)).decode()


class Setup:
    """The receivers, Slack's stand-in and ``callgate serve --http`` configured for them;
    ``env`` and ``state_dir`` put the server on a Kafka deployment."""

    def __init__(
        self, root: Path, env: dict[str, str] | None = None, state_dir: Path | None = None
    ) -> None:
        self.hook, self.broken = Recorder(200), Recorder(500)
        self.slack = Recorder(200, slack_answer)
        self.hook_secret, self.broken_secret = secret(), secret()
        generate_key_pair(root / "keys", "session", "EdDSA", "slack-1")
        self.dead_letters = root / "dead.jsonl"
        users = "".join(
            f'[[slack.users]]\nslack_user = "{sid}"\nuser = "{user}"\ntenant = "acme"\n'
            f"roles = {json.dumps(roles)}\n"
            for sid, user, roles in (
                ("U0FRAN", "fran", ["finance-approver"]),
                ("U0SUE", "sue", ["support", "finance-approver"]),
                ("U0ALICE", "alice", ["support"]),
            )
        )
        config = root / "callgate.toml"
        config.write_text(
            "[notify]\n"
            'console_url = "https://callgate.example.com"\n'
            f"retry_delays_s = {list(RETRIES)}\n"
            "timeout_s = 2\n"
            f'dead_letter_file = "{self.dead_letters}"\n'
            "[[notify.webhooks]]\n"
            f'url = "{self.hook.url}/hook"\n'
            f'secret = "{self.hook_secret}"\n'
            "[[notify.webhooks]]\n"
            f'url = "{self.broken.url}/broken"\n'
            f'secret = "{self.broken_secret}"\n'
            'events = ["approval.pending"]\n'
            'tenants = ["acme"]\n'
            "[slack]\n"
            f'api_url = "{self.slack.url}/api/"\n'
            'bot_token = "xoxb-test-token"\n'
            f'signing_secret = "{SIGNING_SECRET}"\n'
            'channel = "C0APPROVALS"\n'
            f'team_id = "{TEAM}"\n'
            'session_kid = "slack-1"\n'
            f'session_key_file = "{root / "keys" / "slack-1.pem"}"\n' + users
        )
        self._state_dir = state_dir or root / "state"
        self._log = root / "serve.log"
        self._env = {**(env or {}), "CALLGATE_CONFIG": str(config)}
        self.serve = HttpServe(self._state_dir, self._log, env=self._env, dev=True)
        try:
            self.serve.wait_ready(timeout_s=120)
        except BaseException:
            self.stop()
            raise

    def start_again(self) -> None:
        """``serve --http`` anew on the same state, configuration and port (after
        ``serve.stop()``)."""
        port = self.serve.port
        self.serve = HttpServe(self._state_dir, self._log, env=self._env, dev=True, port=port)
        self.serve.wait_ready(timeout_s=120)

    def stop(self) -> None:
        try:
            assert self.serve.stop() == 0, self.serve.log.read_text()
            assert "Traceback" not in self.serve.log.read_text(), self.serve.log.read_text()
        finally:
            for r in (self.hook, self.broken, self.slack):
                r.stop()


@pytest.fixture(scope="module")
def notify_setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    notify_setup = Setup(tmp_path_factory.mktemp("notify"))
    try:
        yield notify_setup
    finally:
        notify_setup.stop()


def propose(notify_setup: Setup, user: str, roles: tuple[str, ...], order: str) -> str:
    token = notify_setup.serve.token(user, "acme", *roles)
    with notify_setup.serve.client(token) as c:
        answer = c.post(
            "/v1/proposals",
            json={"tool": "refunds.issue", "args": {**REFUND_BIG, "order_id": order}},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        ).json()
    assert answer["outcome"] == "approval_required", answer
    invocation: str = answer["invocation_id"]
    return invocation


def status(notify_setup: Setup, invocation: str) -> Any:
    with notify_setup.serve.client(notify_setup.serve.token("alice", "acme", "support")) as c:
        return c.get(f"/v1/invocations/{invocation}").json()


def webhooks(recorder: Recorder, whsec: str, kind: str, invocation: str) -> list[Any]:
    """The verified deliveries of ``kind`` for ``invocation`` (every signature checked)."""
    out = []
    for r in recorder.seen():
        message = Webhook(whsec).verify(r["body"], r["headers"])
        if message["type"] == kind and message["data"]["invocation_id"] == invocation:
            assert r["headers"]["webhook-id"] == f"{kind}.{invocation}"
            out.append(message)
    return out


def slack_click(
    notify_setup: Setup,
    invocation: str,
    slack_user: str,
    action: str = "callgate_approve",
    *,
    team: str = TEAM,
    signing_secret: str = SIGNING_SECRET,
    age_s: int = 0,
) -> httpx.Response:
    """POST an interaction the way Slack does: form-encoded ``payload``, signed."""
    payload = click_payload(invocation, slack_user, action, team)
    body = urlencode({"payload": json.dumps(payload)}).encode()
    return slack_post(notify_setup, body, signing_secret=signing_secret, age_s=age_s)


def click_payload(invocation: str, slack_user: str, action: str, team: str) -> dict[str, Any]:
    """A ``block_actions`` payload: ``slack_user`` clicked ``action`` on the item's message."""
    return {
        "type": "block_actions",
        "team": {"id": team, "domain": "acme"},
        "user": {"id": slack_user, "username": slack_user.lower(), "team_id": team},
        "channel": {"id": "C0APPROVALS", "name": "approvals"},
        "actions": [
            {
                "type": "button",
                "action_id": action,
                "block_id": f"callgate:{invocation}",
                "value": invocation,
                "action_ts": str(time.time()),
            }
        ],
        "response_url": "https://hooks.slack.invalid/actions/T0/1/x",
    }


def slack_post(
    notify_setup: Setup, body: bytes, *, signing_secret: str = SIGNING_SECRET, age_s: int = 0
) -> httpx.Response:
    """POST ``body`` to the interaction endpoint, signed as Slack signs (``v0:ts:body``;
    ``slack_sdk`` for a UTF-8 body, the same HMAC by hand for one that is not)."""
    timestamp = str(int(time.time()) - age_s)
    try:
        signature = SignatureVerifier(signing_secret).generate_signature(
            timestamp=timestamp, body=body.decode("utf-8")
        )
    except UnicodeDecodeError:
        mac = hmac.new(signing_secret.encode(), b"v0:" + timestamp.encode() + b":" + body, "sha256")
        signature = "v0=" + mac.hexdigest()
    assert signature is not None
    return httpx.post(
        f"{notify_setup.serve.url}/v1/slack/interactions",
        content=body,
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": timestamp,
            "X-Slack-Signature": signature,
        },
        timeout=30,
    )


def slack_calls(notify_setup: Setup, method: str) -> list[dict[str, Any]]:
    calls = [r for r in notify_setup.slack.seen() if r["path"] == f"/api/{method}"]
    for r in calls:
        assert r["headers"]["Authorization"] == "Bearer xoxb-test-token"
    return [json.loads(r["body"]) for r in calls]


def test_a_pending_refund_is_told_by_webhook_and_slack_and_approved_in_slack(
    notify_setup: Setup,
) -> None:
    inv = propose(notify_setup, "alice", ("support",), "ORD-601")

    wait_until(
        lambda: webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.pending", inv),
        15,
        "webhook",
    )
    [told] = webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.pending", inv)
    data = told["data"]
    assert (data["tool"], data["actor"], data["target"]) == ("refunds.issue", "alice", "ORD-601")
    assert data["tenant"] == "acme" and data["args"]["amount_cents"] == 25000
    assert data["dry_run"] and data["expires_at"] > time.time() * 1000
    assert data["binds"]["policy_version"] and data["binds"]["dry_run_hash"]
    assert data["console_url"] == f"https://callgate.example.com/#invocation={inv}"
    # What a receiver refuses: another endpoint's secret, a changed body, a replay of the
    # delivery more than five minutes later (its signature covers its timestamp).
    r = next(r for r in notify_setup.hook.seen() if inv in r["body"].decode())
    with pytest.raises(WebhookVerificationError):
        Webhook(notify_setup.broken_secret).verify(r["body"], r["headers"])
    with pytest.raises(WebhookVerificationError):
        Webhook(notify_setup.hook_secret).verify(
            r["body"].replace(b"ORD-601", b"ORD-999"), r["headers"]
        )
    old = int(r["headers"]["webhook-timestamp"]) - 600
    replayed = {**r["headers"], "webhook-timestamp": str(old)}
    replayed["webhook-signature"] = Webhook(notify_setup.hook_secret).sign(
        r["headers"]["webhook-id"], datetime.fromtimestamp(old, UTC), r["body"]
    )
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(notify_setup.hook_secret).verify(r["body"], replayed)

    def posted() -> list[dict[str, Any]]:
        return [m for m in slack_calls(notify_setup, "chat.postMessage") if inv in json.dumps(m)]

    wait_until(posted, 15, "the Slack message")
    [message] = posted()
    assert message["channel"] == "C0APPROVALS"
    text = json.dumps(message["blocks"])
    for shown in ("refunds.issue", "alice", "ORD-601", "Dry run", "The approval binds",
                  "policy version", "Decide before", "refundable_cents"):  # fmt: skip
        assert shown in text, shown
    [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
    assert [(e["action_id"], e["value"]) for e in actions["elements"]] == [
        ("callgate_approve", inv),
        ("callgate_deny", inv),
    ]

    answer = slack_click(notify_setup, inv, "U0FRAN")
    assert answer.status_code == 200, answer.text
    assert answer.json()["decision"] == "granted" and answer.json()["approver"] == "fran"
    approval = status(notify_setup, inv)["approval"]
    assert approval["state"] == "granted" and approval["approver"] == "fran"

    wait_until(
        lambda: webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.decided", inv),
        15,
        "decided",
    )
    [decided] = webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.decided", inv)
    assert decided["data"]["decision"] == "granted" and decided["data"]["approver"] == "fran"
    assert decided["data"]["approval_id"] == approval["approval_id"]
    wait_until(lambda: slack_calls(notify_setup, "chat.update"), 15, "the Slack message's update")
    update = slack_calls(notify_setup, "chat.update")[-1]
    assert update["ts"] == "1700000000.000100" and "granted by fran" in update["text"]


def test_a_refund_the_agent_waits_on_is_approved_in_slack_and_runs_once(
    notify_setup: Setup,
) -> None:
    """Issue 27: the agent's ``callgate propose --wait`` waits; fran's signed Approve click
    on the real interaction endpoint approves; the refund runs without resubmission and
    the agent prints ``executed``; one effect, ``audit verify`` true, replay equal."""
    alice = notify_setup.serve.token("alice", "acme", "support")

    def approve_in_slack(invocation: str) -> None:
        answer = slack_click(notify_setup, invocation, "U0FRAN")
        assert answer.status_code == 200, answer.text
        assert answer.json()["decision"] == "granted" and answer.json()["approver"] == "fran"

    inv = refund_waited_on_runs_once_approved(notify_setup.serve, alice, alice, approve_in_slack)
    assert status(notify_setup, inv)["approval"]["approver"] == "fran"
    again = slack_click(notify_setup, inv, "U0FRAN")  # the same click again: decided, nothing more
    assert again.status_code == 409 and again.json()["error"]["code"] == "not_pending"
    assert len(effects_of(notify_setup.serve, inv)) == 1


def test_a_decision_made_while_serve_is_down_is_told_after_it_starts_again(
    notify_setup: Setup,
) -> None:
    """ADR 0040: the notifier resumes from its stored position: fran approves with the
    command line while no server runs; the restarted server tells the decision, and does
    not tell the item as pending a second time."""
    inv = propose(notify_setup, "alice", ("support",), "ORD-605")
    wait_until(
        lambda: webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.pending", inv),
        15,
        "webhook",
    )
    time.sleep(0.5)  # the position is stored after the poll that told it
    assert notify_setup.serve.stop() == 0, notify_setup.serve.log.read_text()
    fran = notify_setup.serve.token("fran", "acme", "finance-approver")
    approved = value_of(callgate(notify_setup.serve, "approve", inv, "--session", fran))
    assert approved["invocation_id"] == inv and approved["approval_id"], approved
    assert webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.decided", inv) == []
    notify_setup.start_again()
    wait_until(
        lambda: webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.decided", inv),
        15,
        "decided",
    )
    [decided] = webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.decided", inv)
    assert decided["data"]["decision"] == "granted" and decided["data"]["approver"] == "fran"
    time.sleep(1)
    assert (
        len(webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.pending", inv)) == 1
    )  # not again
    assert len(webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.decided", inv)) == 1


def test_a_failing_receiver_is_retried_with_backoff_then_dead_lettered(notify_setup: Setup) -> None:
    inv = propose(notify_setup, "alice", ("support",), "ORD-603")

    def tries() -> list[dict[str, Any]]:
        return [r for r in notify_setup.broken.seen() if inv in r["body"].decode()]

    wait_until(lambda: len(tries()) == 1 + len(RETRIES), 20, "every attempt")
    attempts = tries()
    for r in attempts:  # each attempt is signed anew, under the same webhook-id
        assert Webhook(notify_setup.broken_secret).verify(r["body"], r["headers"])["type"] == (
            "approval.pending"
        )
        assert r["headers"]["webhook-id"] == f"approval.pending.{inv}"

    def dead() -> list[dict[str, Any]]:
        if not notify_setup.dead_letters.exists():
            return []
        lines = notify_setup.dead_letters.read_text().splitlines()
        return [d for d in map(json.loads, lines) if d["invocation_id"] == inv]

    wait_until(dead, 10, "the dead letter")
    [letter] = dead()
    assert letter["target"] == f"{notify_setup.broken.url}/broken"
    assert letter["attempts"] == 1 + len(RETRIES) and letter["error"] == "DeliveryError: HTTP 500"
    assert letter["message_id"] == f"approval.pending.{inv}"
    time.sleep(sum(RETRIES) + 0.5)
    assert len(tries()) == 1 + len(RETRIES)  # no attempt after the last
    # The healthy endpoint got it once.
    assert len(webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.pending", inv)) == 1


def test_slack_refusals_are_coded_and_approve_nothing(notify_setup: Setup) -> None:
    inv = propose(notify_setup, "sue", ("support", "finance-approver"), "ORD-602")
    refusals = {
        "bad signature": (slack_click(notify_setup, inv, "U0FRAN", signing_secret="x" * 32), 401),
        "old timestamp": (slack_click(notify_setup, inv, "U0FRAN", age_s=600), 401),
        "unmapped user": (slack_click(notify_setup, inv, "U0NOBODY"), 403),
        "another team": (slack_click(notify_setup, inv, "U0FRAN", team="T0EVIL"), 403),
        "the actor herself": (slack_click(notify_setup, inv, "U0SUE"), 403),
        "no approver role": (slack_click(notify_setup, inv, "U0ALICE"), 403),
    }
    codes = {}
    for what, (answer, expected) in refusals.items():
        assert answer.status_code == expected, (what, answer.text)
        codes[what] = answer.json()["error"]["code"]
    assert codes == {
        "bad signature": "unauthenticated",
        "old timestamp": "unauthenticated",
        "unmapped user": "approver_forbidden",
        "another team": "approver_forbidden",
        "the actor herself": "approver_forbidden",
        "no approver role": "approver_forbidden",
    }
    assert status(notify_setup, inv)["approval"]["state"] == "pending"  # nothing was approved
    assert effects_of(notify_setup.serve, inv) == []  # nothing executed

    denied = slack_click(notify_setup, inv, "U0FRAN", "callgate_deny")
    assert denied.status_code == 200 and denied.json()["decision"] == "denied"
    assert status(notify_setup, inv)["approval"]["state"] == "denied"
    wait_until(
        lambda: webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.decided", inv),
        15,
        "decided",
    )
    [decided] = webhooks(notify_setup.hook, notify_setup.hook_secret, "approval.decided", inv)
    assert decided["data"]["decision"] == "denied" and decided["data"]["approver"] == "fran"


def test_hostile_interaction_bodies_are_refused_with_a_code_and_approve_nothing(
    notify_setup: Setup,
) -> None:
    """Signed as Slack signs, so that the reader, not the signature, refuses: each hostile
    class in the ``payload`` JSON, a repeated form field (which one would Slack have
    meant?) and a form that is not UTF-8 get a coded refusal; nothing is approved."""
    inv = propose(notify_setup, "alice", ("support",), "ORD-604")
    click = click_payload(inv, "U0FRAN", "callgate_approve", TEAM)
    bodies = {
        name: (b"payload=" + quote_from_bytes(json_body).encode(), status, code)
        for name, (json_body, status, code) in HOSTILE_JSON.items()
    }
    bodies["oversized"] = (b"payload=" + b"y" * 70_000, 413, "payload_too_large")
    other = {**click, "actions": [{**click["actions"][0], "action_id": "callgate_deny"}]}
    bodies["a repeated field"] = (
        urlencode([("payload", json.dumps(click)), ("payload", json.dumps(other))]).encode(),
        422,
        "invalid_request",
    )
    bodies["a raw byte that is not UTF-8"] = (b"payload=\xff", 422, "invalid_request")
    for what, (body, expected, code) in bodies.items():
        answer = slack_post(notify_setup, body)
        assert answer.status_code == expected, (what, answer.text)
        assert answer.json()["error"]["code"] == code, (what, answer.text)
        assert "Traceback" not in answer.text
    assert status(notify_setup, inv)["approval"]["state"] == "pending"  # nothing was decided
    assert effects_of(notify_setup.serve, inv) == []  # nothing executed
    assert "Traceback" not in notify_setup.serve.log.read_text()
