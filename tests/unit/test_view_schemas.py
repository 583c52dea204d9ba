"""Every view value has a published Avro schema and survives it byte for byte (ADR 0016).

- the views the projections write are exactly the views with a schema in ``schemas/views``;
- every record a projection emits, over arbitrary logs, encodes with its view's schema and
  decodes to the same canonical JSON (so replay on Kafka compares equal, and an audit
  record's hash is recomputed from the Avro form);
- values that do not fit their schema are refused, not written half right.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from tests.unit.test_projections import logs, requested

from callgate.adapters.avro_codec import MARKER, schema_fingerprint
from callgate.adapters.view_codec import ViewCodec, ViewSchemaError
from callgate.bootstrap import Settings, bootstrap
from callgate.domain.canonical import canonical_json
from callgate.domain.events import Event
from callgate_projections import Projection, fold_log
from callgate_projections.audit import AuditProjection, record_hash
from callgate_projections.decisions import DecisionsProjection
from callgate_projections.pending import PendingProjection
from callgate_projections.status import StatusProjection
from callgate_projections.usage import UsageProjection

CODEC = ViewCodec.default()
PROJECTIONS: list[Projection[Any]] = [
    StatusProjection(),
    PendingProjection(),
    AuditProjection(),
    DecisionsProjection(),
    UsageProjection(),
]


def test_every_view_written_has_a_published_schema(tmp_path: Any) -> None:
    app = bootstrap(Settings(state_dir=tmp_path))
    written = {view for p in app.projections() for view in getattr(p, "views", ())}
    assert written == CODEC.views == {
        "status", "pending", "audit", "audit_head", "decisions", "usage",
    }  # fmt: skip


def round_trip(view: str, value_json: str) -> str:
    data = CODEC.encode(view, value_json)
    assert data[:2] == MARKER
    assert data[2:10] == schema_fingerprint(CODEC.schema(view))
    decoded_view, text = CODEC.decode_json(data)
    assert decoded_view == view
    return text


@settings(max_examples=150, deadline=None)
@given(log=logs())
def test_every_emitted_view_record_round_trips_through_its_schema(log: list[Event]) -> None:
    for projection in PROJECTIONS:
        _, records = fold_log(projection, log)
        for record in records:
            if record.value_json is not None:
                assert round_trip(record.view, record.value_json) == record.value_json


def test_audit_hash_is_recomputed_from_the_avro_form() -> None:
    from tests.unit.test_projections import ev, permit

    from callgate.domain.events import ExecutionSucceeded

    log = [permit(), ev(ExecutionSucceeded, execution_token="x", result_json='{"ok":true}')]
    _, records = fold_log(AuditProjection(), log)
    (audit,) = [r for r in records if r.view == "audit"]
    _, value = CODEC.decode(CODEC.encode("audit", audit.value_json or ""))
    assert value["hash"] == record_hash(value)


def test_pending_value_carries_the_bindings_in_avro() -> None:
    _, records = fold_log(PendingProjection(), [requested()])
    (record,) = records
    _, value = CODEC.decode(CODEC.encode("pending", record.value_json or ""))
    assert value["args_hash"] == "ah-1" and value["dry_run_hash"] == "dh-1"
    assert value["allow_self_approval"] is False
    assert value["approver_roles"] == ["finance-approver"]


@pytest.mark.parametrize(
    ("view", "value", "why"),
    [
        ("audit_head", {"partition_key": "p", "seq": 1}, "fields differ"),
        ("audit_head", {"partition_key": "p", "seq": 1, "hash": "h", "x": 1}, "fields differ"),
        ("audit_head", {"partition_key": "p", "seq": True, "hash": "h"}, "expected long"),
        ("audit_head", {"partition_key": None, "seq": 1, "hash": "h"}, "expected string"),
        ("nowhere", {}, "no published schema"),
    ],
)
def test_values_that_do_not_fit_are_refused(view: str, value: dict[str, Any], why: str) -> None:
    with pytest.raises(ViewSchemaError, match=why):
        CODEC.encode(view, canonical_json(value))


def test_foreign_bytes_are_refused() -> None:
    with pytest.raises(ViewSchemaError):
        CODEC.decode(b'{"json": true}')
    with pytest.raises(ViewSchemaError, match="fingerprint"):
        CODEC.decode(MARKER + b"\x00" * 8 + b"\x00")


def test_free_form_json_travels_as_canonical_text() -> None:
    _, records = fold_log(PendingProjection(), [requested()])
    data = CODEC.encode("pending", records[0].value_json or "")
    import io

    from fastavro import schemaless_reader

    body = io.BytesIO(data[10:])
    raw = schemaless_reader(body, CODEC.schema("pending"), None)
    assert isinstance(raw, dict)
    assert raw["args_json"] == canonical_json(json.loads(raw["args_json"]))
    assert "args" not in raw
