"""The installed ``callgate`` command on the Kafka backend, end to end (docs/contract.md "Command
line").

One ``callgate --backend kafka --bootstrap-servers B serve`` runs for this module on each
of the suite's Apache Kafka broker, under a topic prefix of its own
(``CALLGATE_TOPIC_PREFIX``) with three partitions (``CALLGATE_PARTITIONS``); every other
command is a fresh subprocess with the same global options, as a script would run it. The
helpers assert that stdout holds exactly one JSON value and that no traceback escapes.

The module's profile is a copy of the shipped one in which ``deploys.trigger`` approvals
live ``DEPLOY_TTL_S`` (the approval-expiry test); serve and every client get the same
``--profile``. The other tests use tools whose lifetimes are unchanged. 10 s, not the
embedded test's 2 s: the pending request lives as long, and on Kafka ``propose`` must first
see its status settle through the status view, then ``approve`` (a fresh process that
reads the views from the broker) must reach the decider; each command takes 1-2 s here,
several on a loaded machine.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import DEFAULT_PROFILE, EXIT_FAILED
from tests.e2e.ownership import created_ticket_ownership
from tests.harness import without_continuation
from tests.kafka_support import (
    Deployment,
    DeploymentSpec,
    KafkaServe,
    ServeSpec,
    cg,
    cli,
    cli_ops,
    cli_propose,
    cli_session,
    librdkafka_lines,
    pending_ids,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

REFUND = {"order_id": "ORD-42", "amount_cents": 5000, "currency": "EUR"}  # < 10000: owner
BIG_REFUND = {"order_id": "ORD-77", "amount_cents": 25000, "currency": "EUR"}  # high impact
DEPLOY = {"service": "billing", "version": "2.0.0", "environment": "production"}
PROVIDER_EVENTS = {"DryRunRequested", "ExecutionRequested", "ExecutionStarted"}
# ``approve`` is a fresh process that reaches the decider in time even on a loaded machine
DEPLOY_TTL_S = 10


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def short_ttl_profile(folder: Path, tool: str, ttl_seconds: int) -> Path:
    """A copy of the shipped profile whose ``tool`` approvals live ``ttl_seconds``."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(DEFAULT_PROFILE.read_text())
    shutil.copy(DEFAULT_PROFILE.parent / doc["policy_file"], folder / doc["policy_file"])
    doc["tools"][tool]["approval_ttl_seconds"] = ttl_seconds
    path = folder / "short-ttl.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return without_continuation(path)  # the agent resubmits after an approval here


KAFKA_DEPLOYMENT = DeploymentSpec(
    "cli",
    profile=lambda root: short_ttl_profile(root / "profile", "deploys.trigger", DEPLOY_TTL_S),
    serve=(ServeSpec(flags=True),),
)


def test_v1_model_supplied_requester_is_identity_spoof(kafka_deployment: Deployment) -> None:
    """V1 / C6: a mutation naming another user is ``identity_spoof``; the command exits 0
    (a denial is a successful command) and nothing reaches a provider."""
    alice = cli_session(kafka_deployment, "alice", "acme", "support")
    before = cg(kafka_deployment, "effects")
    args = {"title": "x", "requester_id": "mallory"}
    answer = cli_propose(kafka_deployment, alice, "tickets.create", args, key="v1-spoof")
    assert answer["outcome"] == "identity_spoof" and "result" not in answer
    assert cg(kafka_deployment, "effects") == before
    assert not PROVIDER_EVENTS & set(kafka_deployment.event_types(answer["invocation_id"]))
    [record] = cg(
        kafka_deployment,
        "audit",
        "--session",
        cli_ops(kafka_deployment),
        "--invocation",
        answer["invocation_id"],
    )
    assert record["proposed_by"] == "model" and record["outcome"] == "identity_spoof"  # C9


def test_v2_confirm_swap_arguments_then_replay_exactly_one_effect(
    kafka_deployment: Deployment,
) -> None:
    """V2 / C5, C8, C11: dry-run → owner confirms → swapped arguments are
    ``approval_mismatch`` naming ``args_hash`` → the confirmed call executes once → the
    same key replays it; the audit verifies and replays to the same projections."""
    alice = cli_session(kafka_deployment, "alice", "acme", "support")
    key = "refund-ORD-42"
    first = cli_propose(kafka_deployment, alice, "refunds.issue", REFUND, key=key)
    assert first["outcome"] == "approval_required", first
    assert first["dry_run"]["order_id"] == "ORD-42" and "result" not in first
    approval = cg(kafka_deployment, "approve", first["invocation_id"], "--session", alice)
    approval_id = approval["approval_id"]

    swapped = cli_propose(
        kafka_deployment, alice, "refunds.issue", {**REFUND, "amount_cents": 6000}, key, approval_id
    )
    assert swapped["outcome"] == "approval_mismatch", swapped
    assert "args_hash" in swapped["error"]["message"], swapped
    assert not [e for e in cg(kafka_deployment, "effects") if e["target"] == "ORD-42"]

    done = cli_propose(kafka_deployment, alice, "refunds.issue", REFUND, key, approval_id)
    assert done["outcome"] == "executed", done
    again = cli_propose(kafka_deployment, alice, "refunds.issue", REFUND, key=key)
    assert again["outcome"] == "replayed" and again["result"] == done["result"], again

    effects = [e for e in cg(kafka_deployment, "effects") if e["target"] == "ORD-42"]
    assert len(effects) == 1 and effects[0]["invocation_id"] == done["invocation_id"], effects
    [record] = cg(
        kafka_deployment,
        "audit",
        "--session",
        cli_ops(kafka_deployment),
        "--invocation",
        done["invocation_id"],
    )
    assert record["authorized_by"]["approval"]["approved_invocation_id"] == first["invocation_id"]
    verified = cg(kafka_deployment, "audit", "verify")
    assert verified["ok"] is True and verified["records"] >= 4
    # The views are eventually consistent; with nothing in flight they converge or differ.
    deadline = time.monotonic() + 30
    while not (replayed := cli(kafka_deployment, "replay", rc=None).value)["equal"]:
        assert time.monotonic() < deadline, replayed
        time.sleep(0.5)
    assert replayed["events"] > 0


def test_denied_call_never_reaches_a_provider(kafka_deployment: Deployment) -> None:
    """C1, C12: policy denial is ``tool_forbidden``: no dry-run, no execution request on
    the log, the effect ledger unchanged, the audit records the deny."""
    alice = cli_session(kafka_deployment, "alice", "acme", "support")
    before = cg(kafka_deployment, "effects")
    denied = cli_propose(kafka_deployment, alice, "deploys.trigger", DEPLOY, key="deny-1")
    assert denied["outcome"] == "tool_forbidden", denied
    types = kafka_deployment.event_types(denied["invocation_id"])
    assert "PolicyDecided" in types and not PROVIDER_EVENTS & set(types), types
    assert cg(kafka_deployment, "effects") == before
    [record] = cg(
        kafka_deployment,
        "audit",
        "--session",
        cli_ops(kafka_deployment),
        "--invocation",
        denied["invocation_id"],
    )
    assert record["authorized_by"]["decision"] == "deny"


def test_pending_approval_is_listed_then_gone_once_approved(kafka_deployment: Deployment) -> None:
    """C4, docs/contract.md "Confirmation": a high-impact refund waits for an approver; ``pending``
    lists it (only for its tenant); the actor may not approve it (coded error, exit 1);
    the approver's grant takes it off the list and executes nothing by itself."""
    alice = cli_session(kafka_deployment, "alice", "acme", "support")
    bob = cli_session(kafka_deployment, "bob", "acme", "finance-approver")
    gina = cli_session(kafka_deployment, "gina", "globex", "support")
    before = cg(kafka_deployment, "effects")
    big = cli_propose(kafka_deployment, alice, "refunds.issue", BIG_REFUND, key="refund-ORD-77")
    assert big["outcome"] == "approval_required", big
    inv = big["invocation_id"]

    wait_for(
        lambda: (
            inv
            in pending_ids(cg(kafka_deployment, "pending", "--session", cli_ops(kafka_deployment)))
        ),
        20,
        "the pending view",
    )
    [row] = [
        p for p in cg(kafka_deployment, "pending", "--session", alice) if p["invocation_id"] == inv
    ]
    assert row["tool"] == "refunds.issue" and row["tenant"] == "acme" and row["actor"] == "alice"
    assert row["args"] == BIG_REFUND and row["dry_run"] == big["dry_run"]
    assert row["confirmation"] == "approver" and row["expires_at"] > now_ms()
    assert inv not in pending_ids(cg(kafka_deployment, "pending", "--session", gina))

    refused = cli(kafka_deployment, "approve", inv, "--session", alice, rc=EXIT_FAILED).value
    assert refused["error"]["code"] == "approver_forbidden", refused
    assert inv in pending_ids(
        cg(kafka_deployment, "pending", "--session", cli_ops(kafka_deployment))
    )  # still waiting

    granted = cg(kafka_deployment, "approve", inv, "--session", bob)
    assert granted["invocation_id"] == inv and granted["approval_id"]
    wait_for(
        lambda: (
            inv
            not in pending_ids(
                cg(kafka_deployment, "pending", "--session", cli_ops(kafka_deployment))
            )
        ),
        20,
        "the tombstone",
    )
    assert cg(kafka_deployment, "effects") == before  # an approval alone executes nothing


def test_an_expired_approval_fails_closed(kafka_deployment: Deployment) -> None:
    """C11: an approval presented after it expired is ``approval_expired``; nothing is
    requested from a provider. The module's profile gives deploy approvals ``DEPLOY_TTL_S``;
    ``approve`` is a fresh process that must reach the decider before the pending request
    (same TTL) expires."""
    rita = cli_session(kafka_deployment, "rita", "acme", "release")
    bob = cli_session(kafka_deployment, "bob", "acme", "release-manager")
    before = cg(kafka_deployment, "effects")
    first = cli_propose(kafka_deployment, rita, "deploys.trigger", DEPLOY, key="deploy-exp")
    assert first["outcome"] == "approval_required", first
    approval = cg(kafka_deployment, "approve", first["invocation_id"], "--session", bob)
    assert approval["expires_at"] - now_ms() <= DEPLOY_TTL_S * 1000

    while now_ms() <= approval["expires_at"] + 100:
        time.sleep(0.1)
    late = cli_propose(
        kafka_deployment, rita, "deploys.trigger", DEPLOY, "deploy-exp", approval["approval_id"]
    )
    assert late["outcome"] == "approval_expired", late
    assert cg(kafka_deployment, "effects") == before
    assert not {"ExecutionRequested", "ExecutionStarted"} & set(
        kafka_deployment.event_types(late["invocation_id"])
    )


def test_serve_prints_a_line_per_settled_decision(
    kafka_deployment: Deployment, kafka_serve: KafkaServe
) -> None:
    """On Kafka the status projection's worker prints serve's line per settled decision
    (time, invocation, tool, outcome) on serve's stderr; no librdkafka line gets there."""
    alice = cli_session(kafka_deployment, "alice", "acme", "support")
    answer = cli_propose(kafka_deployment, alice, "tickets.read", {"ticket_id": "T-77"})
    assert answer["outcome"] == "executed"
    log = kafka_serve.log
    inv = answer["invocation_id"]
    wait_for(lambda: inv in log.read_text(), 30, "serve's line for the settled call")
    [line] = [x for x in log.read_text().splitlines() if inv in x]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ", line), line
    assert line.split()[1:] == [inv, "tickets.read", "executed"], line
    assert not librdkafka_lines(log.read_text())


def test_a_created_ticket_belongs_to_its_tenant(kafka_deployment: Deployment) -> None:
    """C7, ADR 0014: ownership from the system of record, through the Kafka pipeline."""
    created_ticket_ownership(
        lambda user, tenant, roles: cli_session(kafka_deployment, user, tenant, roles),
        lambda token, tool, args, key: cli_propose(kafka_deployment, token, tool, args, key=key),
        "own-kafka-1",
    )
