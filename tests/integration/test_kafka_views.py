"""What other programs see on the topics: published schemas, tenant headers, no tokens.

One ``callgate serve`` runs for this module on the suite's Apache Kafka broker (its own topic
prefix). A scenario with two tenants (reads, an approved and a denied refund, a refund left
pending in the other tenant, a refused approver, poison input) runs once;
then the tests read the raw topics as an approval UI, a compliance tool or an auditor in
another language would (ADR 0016):

- every record of ``requests``, ``events``, ``dead-letter`` and every ``view.*`` topic
  decodes with the Apache ``avro`` library and the ``.avsc`` files alone: the
  single-object header is stripped by hand per the Avro specification, no callgate code;
- no session token appears on any topic but ``requests`` (aborted records included);
  ``events`` carries the verified principal and the token's digest instead;
- every pending record and tombstone names its tenant in the ``cg-tenant`` header, so one
  tenant's UI keeps only its own items;
- ``requests`` is created with the bounded retention (``requests_retention_ms``).
"""

from __future__ import annotations

import hashlib
import io
import json
import uuid
from dataclasses import dataclass
from typing import Any

import avro.io
import avro.schema
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource  # not re-exported by the stubs
from tests.e2e.helpers import REPO
from tests.harness import write_profile
from tests.kafka_support import (
    REFUND,
    Deployment,
    DeploymentSpec,
    token,
)

from callgate.adapters.kafka.backend import KafkaBackend
from callgate.adapters.kafka.client import Record, make_producer, read_partitions_to_end
from callgate.domain import events as ev
from callgate.domain.codes import Code, Rejection
from callgate.surfaces.sdk import Gateway

pytestmark = pytest.mark.kafka

SCHEMAS = REPO / "schemas"
SEVEN_DAYS_MS = 7 * 24 * 3600 * 1000
GLOBEX_REFUND = {**REFUND, "order_id": "GORD-1"}  # globex owns GORD-* (default profile)


@dataclass
class Run:
    """What the scenario did: the tokens it used and the invocations it left behind."""

    tokens: dict[str, str]
    pending_globex: str
    approved: str
    denied: str


# The agent resubmits after an approval here (C4, C8, C11, V2: ADR 0029).
KAFKA_DEPLOYMENT = DeploymentSpec("views", profile=lambda root: write_profile(root / "profile"))


@pytest.fixture(scope="module")
def run(kafka_deployment: Deployment, kafka_gateway: Gateway) -> Run:
    alice = token(kafka_gateway, "alice", "acme", "support")
    bob = token(kafka_gateway, "bob", "acme", "finance-approver")
    gina = token(kafka_gateway, "gina", "globex", "support")
    assert (
        kafka_gateway.propose(alice, "tickets.read", {"ticket_id": "T-1"})["outcome"] == "executed"
    )

    key = f"views-{uuid.uuid4().hex[:8]}"
    first = kafka_gateway.propose(alice, "refunds.issue", REFUND, idempotency_key=key)
    assert first["outcome"] == "approval_required", first
    with pytest.raises(Rejection) as refused:  # owner confirmation: only alice may
        kafka_gateway.approve(first["invocation_id"], bob)
    assert refused.value.code is Code.APPROVER_FORBIDDEN
    approval = kafka_gateway.approve(first["invocation_id"], alice)
    done = kafka_gateway.propose(alice, "refunds.issue", REFUND, key, approval["approval_id"])
    assert done["outcome"] == "executed", done

    other = {**REFUND, "order_id": "ORD-9"}
    denied = kafka_gateway.propose(alice, "refunds.issue", other, idempotency_key=f"d-{key}")
    kafka_gateway.deny(denied["invocation_id"], alice, reason="not today")

    left = kafka_gateway.propose(gina, "refunds.issue", GLOBEX_REFUND, idempotency_key=f"g-{key}")
    assert left["outcome"] == "approval_required", left
    with pytest.raises(Rejection) as hidden:  # another tenant's: not even revealed
        kafka_gateway.approve(left["invocation_id"], bob)
    assert hidden.value.code is Code.NOT_PENDING

    producer = make_producer(kafka_deployment.bootstrap)  # poison, for the dead-letter topic
    producer.produce(
        kafka_deployment.topics.physical("requests"), key=b"poison", value=b"\x00not avro"
    )
    assert producer.flush(30) == 0

    pending = {denied["invocation_id"], left["invocation_id"]}
    still = {first["invocation_id"]} | pending
    assert kafka_gateway.backend.wait(
        lambda: (
            {k for k in still if kafka_gateway.backend.view("pending", k)}
            == {left["invocation_id"]}
        ),
        60,
    ), "the pending view did not settle"
    assert kafka_gateway.backend.wait(lambda: bool(kafka_deployment.records("dead-letter")), 60)
    return Run(
        tokens={"alice": alice, "bob": bob, "gina": gina},
        pending_globex=left["invocation_id"],
        approved=first["invocation_id"],
        denied=denied["invocation_id"],
    )


def our_topics(kafka_deployment: Deployment) -> list[str]:
    admin = AdminClient({"bootstrap.servers": kafka_deployment.bootstrap})
    names = admin.list_topics(timeout=30).topics
    return sorted(t for t in names if t.startswith(kafka_deployment.prefix + "."))


def everything(kafka_deployment: Deployment, topic: str) -> list[Record]:
    """Every record, aborted transactions' included (``read_uncommitted``)."""
    return read_partitions_to_end(kafka_deployment.bootstrap, topic, isolation="read_uncommitted")


# --- a call follows its own request ----------------------------------------------------------


def test_a_call_reads_its_own_partition_not_the_views(
    kafka_deployment: Deployment, run: Run
) -> None:
    """``propose`` reads no view; ``approve`` reads the pending view (compacted) and, after a
    grant, the invocation's status by its key (what became of the call, ADR 0029)."""
    kafka_gateway = kafka_deployment.connect()
    try:
        alice = run.tokens["alice"]
        assert (
            kafka_gateway.propose(alice, "tickets.read", {"ticket_id": "T-2"})["outcome"]
            == "executed"
        )
        first = kafka_gateway.propose(
            alice, "refunds.issue", REFUND, idempotency_key=uuid.uuid4().hex
        )
        assert first["outcome"] == "approval_required"
        backend = kafka_gateway.backend
        assert isinstance(backend, KafkaBackend) and backend.views_read == frozenset()
        assert kafka_gateway.approve(first["invocation_id"], alice)["approval_id"]
        assert backend.views_read == {"pending", "status"}
    finally:
        kafka_gateway.close()


# --- interoperability: Apache avro and the .avsc files only -----------------------------------


def crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO as the Avro specification writes it ("Schema Fingerprints")."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp


def published_schemas() -> dict[bytes, tuple[str, avro.schema.Schema]]:
    """Fingerprint (as in the single-object header) -> (file stem, schema), every version."""
    found: dict[bytes, tuple[str, avro.schema.Schema]] = {}
    for path in sorted(SCHEMAS.rglob("*.avsc")):
        schema = avro.schema.parse(path.read_text(encoding="utf-8"))
        fp = crc64_avro(schema.canonical_form.encode()).to_bytes(8, "little")
        found.setdefault(fp, (path.stem, schema))
    return found


def decode_single_object(data: bytes, schemas: dict[bytes, tuple[str, Any]]) -> tuple[str, Any]:
    """Avro spec "Single object encoding": C3 01, 8-byte fingerprint, then the body."""
    assert data[:2] == b"\xc3\x01", data[:10]
    name, schema = schemas[data[2:10]]
    body = io.BytesIO(data[10:])
    datum = avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(body))
    assert body.tell() == len(data) - 10, "bytes left after the body"
    return name, datum


def test_every_topic_decodes_with_apache_avro_and_the_published_schemas(
    kafka_deployment: Deployment, run: Run
) -> None:
    schemas = published_schemas()
    decoded: dict[str, int] = {}
    for topic in our_topics(kafka_deployment):
        kind = topic[len(kafka_deployment.prefix) + 1 :]
        if kind.startswith("changelog."):
            continue  # a process's own state (canonical JSON), not a published interface
        for record in read_partitions_to_end(kafka_deployment.bootstrap, topic):
            if record.value is None:
                continue  # a view tombstone
            if kind == "requests" and record.key == b"poison":
                continue  # the poison we sent: not Avro, dead-lettered
            name, datum = decode_single_object(record.value, schemas)
            assert isinstance(datum, dict)
            if kind.startswith("view."):
                assert name == kind.removeprefix("view."), (topic, name)
                assert record.key is not None
            else:
                assert datum["event_type"] == name
                assert record.key == datum["partition_key"].encode()
            if name == "EventDeadLettered":
                assert datum["original"] == b"\x00not avro" and datum["source_topic"] == "requests"
            decoded[kind] = decoded.get(kind, 0) + 1
    views = {"view.status", "view.pending", "view.audit", "view.audit_head", "view.decisions"}
    assert {"requests", "events", "dead-letter"} | views <= set(decoded), decoded


def test_pending_record_decoded_by_avro_carries_what_the_approval_binds(
    kafka_deployment: Deployment, run: Run
) -> None:
    schemas = published_schemas()
    topic = kafka_deployment.topics.view("pending")
    mine = [r for r in read_partitions_to_end(kafka_deployment.bootstrap, topic)]
    values = [
        decode_single_object(r.value, schemas)[1]
        for r in mine
        if r.key == run.pending_globex.encode() and r.value is not None
    ]
    assert values, "the pending record of the globex refund is missing"
    value = values[-1]
    assert value["tenant"] == "globex" and value["actor"] == "gina"
    assert value["tool"] == "refunds.issue" and value["target"] == "GORD-1"
    assert json.loads(value["args_json"]) == GLOBEX_REFUND
    for binding in ("args_hash", "dry_run_hash", "policy_version", "partition_key"):
        assert value[binding], binding
    assert json.loads(value["dry_run_json"])["order_id"] == "GORD-1"
    assert value["confirmation"] == "owner" and value["allow_self_approval"] is False
    assert value["expires_at"] > value["requested_at"]


# --- no bearer credentials kept ----------------------------------------------------------------


def test_no_session_token_on_any_topic_but_requests(kafka_deployment: Deployment, run: Run) -> None:
    found: dict[str, set[str]] = {}
    for topic in our_topics(kafka_deployment):
        for record in everything(kafka_deployment, topic):
            blobs = [record.key or b"", record.value or b"", *record.headers.values()]
            for who, tok in run.tokens.items():
                if any(tok.encode() in blob for blob in blobs):
                    found.setdefault(topic, set()).add(who)
    assert set(found) == {kafka_deployment.topics.physical("requests")}, found
    assert found[kafka_deployment.topics.physical("requests")] == {"alice", "bob", "gina"}


def test_events_record_the_principal_and_the_token_digest(
    kafka_deployment: Deployment, run: Run
) -> None:
    def digest(who: str) -> str:
        return "sha256:" + hashlib.sha256(run.tokens[who].encode()).hexdigest()

    decided = [e for _, e in kafka_deployment.events() if isinstance(e, ev.PolicyDecided)]
    alice = [e for e in decided if e.actor == "alice"]
    assert alice and {e.session_digest for e in alice} == {digest("alice")}
    assert all(e.session_id and e.tenant == "acme" for e in alice)
    granted = [e for _, e in kafka_deployment.events() if isinstance(e, ev.ApprovalGranted)]
    assert granted and {e.session_digest for e in granted} == {digest("alice")}
    refused = [
        e for _, e in kafka_deployment.events() if isinstance(e, ev.ApprovalDecisionRejected)
    ]
    assert [e.session_digest for e in refused] == [digest("bob")]


def test_requests_topic_has_the_bounded_retention(kafka_deployment: Deployment, run: Run) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_deployment.bootstrap})
    resource = ConfigResource("topic", kafka_deployment.topics.physical("requests"))
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["retention.ms"].value == str(SEVEN_DAYS_MS)
    events = ConfigResource("topic", kafka_deployment.topics.physical("events"))
    assert admin.describe_configs([events])[events].result(timeout=30)["retention.ms"].value == "-1"


# --- tenant-scoped consumption -----------------------------------------------------------------


def tenant_ui(kafka_deployment: Deployment, tenant: str) -> dict[str, dict[str, Any]]:
    """An approval UI for one tenant, as README "Views" tells it to consume ``view.pending``:
    keep the records whose ``cg-tenant`` header is yours, apply the tombstones of keys you
    hold. It never decodes another tenant's value."""
    schemas = published_schemas()
    table: dict[str, dict[str, Any]] = {}
    for record in read_partitions_to_end(
        kafka_deployment.bootstrap, kafka_deployment.topics.view("pending")
    ):
        key = (record.key or b"").decode()
        if record.headers.get("cg-tenant") != tenant.encode():
            continue
        if record.value is None:
            table.pop(key, None)
        else:
            table[key] = decode_single_object(record.value, schemas)[1]
    return table


def test_each_pending_record_and_tombstone_names_its_tenant(
    kafka_deployment: Deployment, run: Run
) -> None:
    schemas = published_schemas()
    tenant_of: dict[str, str] = {}
    tombstones = 0
    for record in read_partitions_to_end(
        kafka_deployment.bootstrap, kafka_deployment.topics.view("pending")
    ):
        key = (record.key or b"").decode()
        header = record.headers.get("cg-tenant", b"").decode()
        if record.value is None:
            assert header == tenant_of[key], key  # a tombstone names the tenant too
            tombstones += 1
        else:
            tenant_of[key] = decode_single_object(record.value, schemas)[1]["tenant"]
            assert header == tenant_of[key]
    assert tombstones >= 2  # the approved and the denied refund


def test_one_tenants_ui_sees_only_its_own_items(kafka_deployment: Deployment, run: Run) -> None:
    assert list(tenant_ui(kafka_deployment, "globex")) == [run.pending_globex]
    assert run.pending_globex not in tenant_ui(kafka_deployment, "acme")
    assert {run.approved, run.denied}.isdisjoint(tenant_ui(kafka_deployment, "acme"))


def test_status_records_name_their_tenant(kafka_deployment: Deployment, run: Run) -> None:
    for record in read_partitions_to_end(
        kafka_deployment.bootstrap, kafka_deployment.topics.view("status")
    ):
        if record.key == run.pending_globex.encode():
            assert record.headers.get("cg-tenant") == b"globex"
        if record.key == run.approved.encode():
            assert record.headers.get("cg-tenant") == b"acme"
