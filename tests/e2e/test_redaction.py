"""Sensitive catalog fields (ADR 0035): their values reach no output, only keyed digests.

A copy of the default profile marks ``refunds.issue``'s ``order_id`` (also its target) and
``reason`` sensitive. ``callgate serve --http`` runs on the embedded store; a refund with
sentinel values goes through dry-run, owner confirmation and execution with the installed
command, plus a call whose sensitive argument is invalid. Then every output is collected:
the CLI's ``propose``/``pending``/``status``/``audit``/``replay`` output, the HTTP views
(invocations, pending, audit), the console's page and its server-sent pending feed, the
metrics page (every label), the audit export in both formats, serve's own log, and the
spans every process exported (``[tracing]`` on, to an OTLP receiver on loopback). No
sentinel appears in any of them; the digest does, the same for the same value. The log
keeps the full arguments (the approval binds them): the sentinels are in the store's log.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from callgate.domain.redaction import PREFIX
from tests import otlp_support as otlp
from tests.e2e.helpers import DEFAULT_PROFILE, propose, run, session
from tests.http_support import HttpServe, wait_until

pytestmark = pytest.mark.e2e

ORDER = "ORD-SENTINEL-5e1f9a"  # an acme order (ORD-*): the sensitive target
REASON = "card 4111-SENTINEL-77c2 was charged twice"
TOO_LONG = "SENTINEL-LONG-" + "x" * 600  # over reason's maxLength: invalid_arguments
SENTINELS = ("SENTINEL",)  # each sentinel value holds this


def sensitive_profile(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(DEFAULT_PROFILE.read_text())
    shutil.copy(DEFAULT_PROFILE.parent / doc["policy_file"], folder / doc["policy_file"])
    doc["tools"]["refunds.issue"]["sensitive"] = ["order_id", "reason"]
    path = folder / "sensitive.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def receiver() -> Iterator[tuple[str, otlp.Received]]:
    with otlp.grpc_receiver() as found:
        yield found


@pytest.fixture
def traced_http_serve(tmp_path: Path, receiver: tuple[str, otlp.Received]) -> Iterator[HttpServe]:
    profile = sensitive_profile(tmp_path / "profile")
    state = tmp_path / "state"
    state.mkdir()
    (state / "callgate.toml").write_text(f'[tracing]\nenabled = true\nendpoint = "{receiver[0]}"\n')
    # serve exports its spans within 0.2 s (the batch processor's delay: 5 s by default)
    env = {"OTEL_BSP_SCHEDULE_DELAY": "200"}
    server = HttpServe(state, tmp_path / "serve.log", profile=profile, dev=True, env=env)
    try:
        server.wait_ready()
        yield server
    finally:
        assert server.stop() == 0, server.log.read_text()


def first_sse_event(server: HttpServe, token: str) -> str:
    """The console's pending feed: its first ``event: pending`` message."""
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.stream("GET", f"{server.url}/v1/pending/events", headers=headers, timeout=30) as r:
        text = ""
        for chunk in r.iter_text():
            text += chunk
            if "event: pending" in text and text.endswith("\n\n"):
                return text
    raise AssertionError(f"no pending event: {text!r}")


def test_sensitive_values_reach_no_output(
    traced_http_serve: HttpServe, tmp_path: Path, receiver: tuple[str, otlp.Received]
) -> None:
    state, profile = traced_http_serve.state_dir, traced_http_serve.profile
    outputs: dict[str, str] = {}

    def cli(label: str, *args: str) -> Any:
        result = run(state, *args, profile=profile)
        outputs[label] = result.stdout + result.stderr
        return result.value

    alice = session(state, "alice", "acme", "support")
    operator = session(state, "operator", "ops", "callgate-operator")
    refund = {"order_id": ORDER, "amount_cents": 5000, "currency": "EUR", "reason": REASON}
    first = propose(state, alice, "refunds.issue", refund, key="r-1", profile=profile)
    outputs["propose (dry-run)"] = json.dumps(first)
    assert first["outcome"] == "approval_required", first
    inv = first["invocation_id"]

    pending = cli("pending", "pending", "--session", operator)
    [item] = [p for p in pending if p["invocation_id"] == inv]
    assert item["args"]["order_id"].startswith(PREFIX) and item["args"]["amount_cents"] == 5000
    assert item["args"]["reason"].startswith(PREFIX)
    http = traced_http_serve.client(alice)
    outputs["http pending"] = http.get("/v1/pending").text
    outputs["console feed"] = first_sse_event(traced_http_serve, alice)
    outputs["console page"] = http.get("/").text

    approval = cli("approve", "approve", inv, "--session", alice)
    approval_id = approval["approval_id"]
    assert approval["outcome"] == "executed", approval  # the approved call continued
    done = propose(state, alice, "refunds.issue", refund, "r-1", approval_id, profile=profile)
    outputs["propose (replayed)"] = json.dumps(done)
    assert done["outcome"] == "replayed", done  # a resubmission replays the continued call
    # The approval binds the full arguments: another order under it is a mismatch.
    swapped = {**refund, "order_id": "ORD-SENTINEL-other"}
    mismatch = propose(state, alice, "refunds.issue", swapped, "r-1", approval_id, profile=profile)
    outputs["propose (mismatch)"] = json.dumps(mismatch)
    assert mismatch["outcome"] == "approval_mismatch", mismatch
    invalid = propose(
        state, alice, "refunds.issue", {**refund, "reason": TOO_LONG}, profile=profile
    )
    outputs["propose (invalid)"] = json.dumps(invalid)
    assert invalid["outcome"] == "invalid_arguments", invalid

    for label, i in (("status executed", inv), ("status replayed", done["invocation_id"])):
        cli(label, "status", i, "--session", operator)
        outputs[f"http {label}"] = http.get(f"/v1/invocations/{i}").text
    cli("audit", "audit", "--session", operator)
    cli("audit (human)", "audit", "--session", operator)
    outputs["audit (human)"] = run(
        state, "audit", "--session", operator, profile=profile, json_mode=False
    ).stdout
    outputs["http audit"] = traced_http_serve.client(operator).get("/v1/audit").text
    outputs["metrics"] = http.get("/metrics").text
    assert cli("replay", "replay")["equal"] is True
    for fmt in ("cloudevents", "ocsf"):
        out = tmp_path / f"export.{fmt}.jsonl"
        cli(f"export {fmt}", "audit", "export", "--session", operator, "--format", fmt,
            "--output", str(out))  # fmt: skip
        outputs[f"export file {fmt}"] = out.read_text()
    outputs["serve log"] = traced_http_serve.log.read_text()
    received = receiver[1]
    wait_until(
        lambda: "callgate.provider execute" in {s.name for s in otlp.spans_of(received)},
        30,
        "serve's spans",
    )
    outputs["spans"] = otlp.span_texts(received)
    assert "execute_tool refunds.issue" in outputs["spans"]

    leaked = {label for label, text in outputs.items() if any(s in text for s in SENTINELS)}
    assert not leaked, {label: outputs[label][:3000] for label in leaked}

    # The digest stands for the value everywhere, the same for the same value.
    digest = item["args"]["order_id"]
    for label in ("propose (replayed)", "http status executed", "export file cloudevents"):
        assert digest in outputs[label], label
    # The log keeps the full arguments: the events that bind the approval.
    log = sqlite3.connect(state / "events.sqlite3")
    try:
        payloads = b"".join(bytes(row[0]) for row in log.execute("SELECT payload FROM log"))
    finally:
        log.close()
    assert ORDER.encode() in payloads and REASON.encode() in payloads
