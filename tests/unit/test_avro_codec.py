"""AvroCodec: single-object encoding of every event, and fail-closed decoding.

Any undecodable input must surface as ``MalformedEvent`` (docs/contract.md "Order of checks": the
first outcome is ``malformed_event``, dead-lettered with its reason), never as another
exception that could crash a consumer or be skipped.
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import typing
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from fastavro.schema import to_parsing_canonical_form
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgate.adapters.avro_codec import (
    MARKER,
    AvroCodec,
    MalformedEvent,
    SchemaSetError,
    schema_fingerprint,
)
from callgate.domain.events import EVENT_TYPES, Event, PolicyDecided, ToolCallProposed

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
CODEC = AvroCodec.from_directory(SCHEMAS)

LONG = st.integers(min_value=-(2**63), max_value=2**63 - 1)
INT = st.integers(min_value=-(2**31), max_value=2**31 - 1)
TEXT = st.text(max_size=30)


def _values(tp: Any) -> st.SearchStrategy[Any]:
    """Values for one event field, from the field's Python type (domain/events/, not the schema)."""
    if tp is str:
        return TEXT
    if tp is int:
        return LONG
    if tp is bool:
        return st.booleans()
    if tp is bytes:
        return st.binary(max_size=60)
    if tp == (str | None):
        return st.none() | TEXT
    if tp == (bool | None):
        return st.none() | st.booleans()
    if tp == (int | None):
        return st.none() | LONG
    if tp == tuple[str, ...]:
        return st.lists(TEXT, max_size=4).map(tuple)
    raise AssertionError(f"no strategy for field type {tp!r}: extend the test and the schemas")


def events_of(cls: type[Event]) -> st.SearchStrategy[Event]:
    hints = typing.get_type_hints(cls)
    fields = {f.name: _values(hints[f.name]) for f in dataclasses.fields(cls)}
    fields["schema_version"] = INT  # Avro int: the one 32-bit field
    return st.builds(cls, **fields)


ANY_EVENT = st.one_of([events_of(cls) for cls in EVENT_TYPES])


E = typing.TypeVar("E", bound=Event)


def sample(cls: type[E]) -> E:
    """A fixed, fully populated event of ``cls`` (deterministic, for byte-level tests)."""
    values: dict[Any, Any] = {
        str: "value-ü",
        int: 1_760_000_000_000,
        bool: True,
        bytes: b"\x00\xc3\x01raw",
        str | None: "maybe",
        bool | None: False,
        int | None: -32021,
        tuple[str, ...]: ("a", "b"),
    }
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: values[hints[f.name]] for f in dataclasses.fields(cls)}
    kwargs["schema_version"] = 1
    return cls(**kwargs)


def crc64_avro(data: bytes) -> int:
    """CRC-64-AVRO exactly as written in the Avro specification ("Schema Fingerprints")."""
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


# --- round trip --------------------------------------------------------------------------


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_event_type_round_trips(cls: type[Event], data: st.DataObject) -> None:
    event = data.draw(events_of(cls))
    encoded = CODEC.encode(event)
    decoded = CODEC.decode(encoded)
    assert type(decoded) is cls
    assert decoded == event
    assert CODEC.event_type_of(encoded) == cls.__name__


def test_decoded_values_keep_python_types() -> None:
    """Timestamps stay int milliseconds (no datetime), arrays become tuples (immutable events)."""
    event = sample(PolicyDecided)
    decoded = CODEC.decode(CODEC.encode(event))
    assert isinstance(decoded, PolicyDecided)
    assert type(decoded.occurred_at) is int
    assert decoded.occurred_at == 1_760_000_000_000
    assert type(decoded.roles) is tuple
    assert type(decoded.determining_policies) is tuple


def test_default_finds_the_repository_schemas() -> None:
    event = sample(ToolCallProposed)
    assert AvroCodec.default().decode(CODEC.encode(event)) == event
    assert AvroCodec.default() is AvroCodec.default()


# --- wire format -------------------------------------------------------------------------


def test_crc64_avro_matches_the_spec_test_vector() -> None:
    # Avro's own test suite: the fingerprint of the schema "null" is 7195948357588979594.
    assert crc64_avro(b'"null"') == 7195948357588979594
    assert schema_fingerprint("null") == crc64_avro(b'"null"').to_bytes(8, "little")


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_header_is_marker_plus_little_endian_fingerprint(cls: type[Event]) -> None:
    schema = json.loads((SCHEMAS / f"{cls.__name__}.avsc").read_text())
    canonical = to_parsing_canonical_form(schema).encode()
    encoded = CODEC.encode(sample(cls))
    assert encoded[:2] == MARKER == b"\xc3\x01"
    assert encoded[2:10] == crc64_avro(canonical).to_bytes(8, "little")


def test_fingerprints_are_distinct_per_event_type() -> None:
    headers = {CODEC.encode(sample(cls))[:10] for cls in EVENT_TYPES}
    assert len(headers) == len(EVENT_TYPES)


# --- malformed input ---------------------------------------------------------------------


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_truncation_at_every_byte_raises_malformed_event(cls: type[Event]) -> None:
    encoded = CODEC.encode(sample(cls))
    for end in range(len(encoded)):
        with pytest.raises(MalformedEvent):
            CODEC.decode(encoded[:end])


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200))
def test_random_bytes_raise_malformed_event(data: bytes) -> None:
    with pytest.raises(MalformedEvent):
        CODEC.decode(data)


@settings(max_examples=300, deadline=None)
@given(cls=st.sampled_from(EVENT_TYPES), body=st.binary(max_size=300))
def test_random_body_behind_a_valid_header_never_crashes(cls: type[Event], body: bytes) -> None:
    """The header passes, the body is garbage: an event of that type or MalformedEvent."""
    header = CODEC.encode(sample(cls))[:10]
    try:
        decoded = CODEC.decode(header + body)
    except MalformedEvent:
        return
    assert type(decoded) is cls


@settings(max_examples=200, deadline=None)
@given(event=ANY_EVENT, position=st.integers(min_value=0), value=st.integers(0, 255))
def test_corrupted_byte_never_crashes(event: Event, position: int, value: int) -> None:
    encoded = bytearray(CODEC.encode(event))
    encoded[position % len(encoded)] = value
    try:
        decoded = CODEC.decode(bytes(encoded))
    except MalformedEvent:
        return
    assert isinstance(decoded, Event)


def test_unknown_fingerprint_raises_malformed_event() -> None:
    encoded = CODEC.encode(sample(ToolCallProposed))
    forged = MARKER + bytes(8) + encoded[10:]
    assert CODEC.event_type_of(forged) is None
    with pytest.raises(MalformedEvent, match="unknown schema fingerprint 0000000000000000"):
        CODEC.decode(forged)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "too short"),
        (b"\xc3\x01\x00", "too short"),
        (b"\x00" + b"\x00" * 20, "not Avro single-object encoding"),
        (b"\xc3\x02" + b"\x00" * 20, "not Avro single-object encoding"),
        (None, "expected bytes, got NoneType"),  # a Kafka tombstone
        ("\xc3\x01text", "expected bytes, got str"),
    ],
)
def test_bad_headers_raise_malformed_event_with_reason(data: Any, reason: str) -> None:
    with pytest.raises(MalformedEvent, match=reason) as info:
        CODEC.decode(data)
    assert reason in info.value.reason
    assert isinstance(info.value, ValueError)
    assert CODEC.event_type_of(data) is None


def test_trailing_bytes_raise_malformed_event() -> None:
    encoded = CODEC.encode(sample(ToolCallProposed))
    with pytest.raises(MalformedEvent, match="1 trailing bytes"):
        CODEC.decode(encoded + b"\x00")


def test_body_with_another_event_type_raises_malformed_event() -> None:
    """``event_type`` in the body must agree with the record named by the fingerprint."""
    event = sample(ToolCallProposed)
    schema = parse_schema(json.loads((SCHEMAS / "ToolCallProposed.avsc").read_text()))
    record = {**event.to_dict(), "event_type": "PolicyDecided"}
    body = io.BytesIO()
    schemaless_writer(body, schema, record)
    with pytest.raises(MalformedEvent, match="contradicts the ToolCallProposed schema"):
        CODEC.decode(CODEC.encode(event)[:10] + body.getvalue())


def test_invalid_utf8_raises_malformed_event() -> None:
    encoded = bytearray(CODEC.encode(sample(ToolCallProposed)))
    start = encoded.index(b"value-\xc3\xbc")
    encoded[start + 6] = 0xFF  # breaks the two-byte sequence of "ü"
    with pytest.raises(MalformedEvent, match="UnicodeDecodeError"):
        CODEC.decode(bytes(encoded))


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"schema_version": 2**31}, "schema_version out of range"),  # Avro int is 32-bit
        ({"occurred_at": 2**63}, "OverflowError"),  # Avro long is 64-bit
        ({"tool": None}, "must be string on field tool"),
        ({"idempotency_key": 5}, "idempotency_key"),
        ({"event_id": "\udc80"}, "UnicodeEncodeError"),
    ],
)
def test_unencodable_event_raises_malformed_event(changes: dict[str, Any], reason: str) -> None:
    event = dataclasses.replace(sample(ToolCallProposed), **changes)
    with pytest.raises(MalformedEvent, match="cannot encode ToolCallProposed") as info:
        CODEC.encode(event)
    assert reason in info.value.reason


# --- evolution: old versions decode into the current classes -----------------------------


def _schema_dir(tmp_path: Path) -> Path:
    target = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, target)
    return target


def test_older_released_version_decodes_into_current_event(tmp_path: Path) -> None:
    """A v0 writer without ``approval_id`` still decodes; the reader default fills it."""
    root = _schema_dir(tmp_path)
    v0 = json.loads((root / "ToolCallProposed.avsc").read_text())
    v0["fields"] = [f for f in v0["fields"] if f["name"] != "approval_id"]
    (root / "released" / "v0").mkdir()
    (root / "released" / "v0" / "ToolCallProposed.avsc").write_text(json.dumps(v0))
    codec = AvroCodec.from_directory(root)

    current = dataclasses.replace(sample(ToolCallProposed), approval_id=None)
    record = {**current.to_dict(), "event_type": "ToolCallProposed"}
    del record["approval_id"]
    body = io.BytesIO()
    schemaless_writer(body, parse_schema(v0), record)
    old_bytes = MARKER + schema_fingerprint(v0) + body.getvalue()

    assert codec.event_type_of(old_bytes) == "ToolCallProposed"
    assert codec.decode(old_bytes) == current
    assert codec.encode(current)[:10] != old_bytes[:10]  # new events use the current schema
    with pytest.raises(MalformedEvent, match="unknown schema fingerprint"):
        CODEC.decode(old_bytes)  # a codec without v0 registered refuses it


def test_missing_schema_for_an_event_class_is_refused(tmp_path: Path) -> None:
    root = _schema_dir(tmp_path)
    (root / "DryRunFailed.avsc").unlink()
    with pytest.raises(SchemaSetError, match="DryRunFailed"):
        AvroCodec.from_directory(root)


def test_schema_drifting_from_its_class_is_refused(tmp_path: Path) -> None:
    root = _schema_dir(tmp_path)
    path = root / "DryRunFailed.avsc"
    schema = json.loads(path.read_text())
    schema["fields"].append({"name": "extra", "type": "string", "default": ""})
    path.write_text(json.dumps(schema))
    with pytest.raises(SchemaSetError, match="extra"):
        AvroCodec.from_directory(root)


def test_released_schema_without_current_schema_is_refused(tmp_path: Path) -> None:
    root = _schema_dir(tmp_path)
    orphan = {"type": "record", "name": "Gone", "namespace": "callgate.events", "fields": []}
    (root / "released" / "v1" / "Gone.avsc").write_text(json.dumps(orphan))
    with pytest.raises(SchemaSetError, match="released/v1/Gone"):
        AvroCodec.from_directory(root)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "DryRunFailed.avsc"),
        ('["null", "string"]', "not a record schema"),
        (
            '{"type": "record", "name": "DryRunFailed", "namespace": "callgate.events"}',
            "record",
        ),
    ],
)
def test_unreadable_schema_file_is_refused(tmp_path: Path, content: str, reason: str) -> None:
    root = _schema_dir(tmp_path)
    (root / "DryRunFailed.avsc").write_text(content)
    with pytest.raises(SchemaSetError, match=reason):
        AvroCodec.from_directory(root)
