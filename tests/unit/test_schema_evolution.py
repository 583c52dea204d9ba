"""The ``.avsc`` files are the source of truth, and they evolve only compatibly.

docs/contract.md "Shape": events are Avro, versioned, and evolve only in compatible ways. Two
guards:

- each current schema matches its class in ``callgate.domain.events`` field for field, so the
  Python classes cannot drift from the schemas;
- each current schema is backward and forward compatible with every released version in
  ``schemas/released/<version>/``, checked by writing records with one schema and reading
  them with the other through fastavro's schema resolution.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from callgate.domain.events import EVENT_TYPES, Event

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
RELEASED = SCHEMAS / "released"
ENVELOPE = (
    "event_type",
    "schema_version",
    "event_id",
    "invocation_id",
    "partition_key",
    "causation_id",
    "correlation_id",
    "occurred_at",
    "producer",
)

Schema = dict[str, Any]
Edit = Callable[[list[Schema]], object]


def load(path: Path) -> Schema:
    schema: Schema = json.loads(path.read_text(encoding="utf-8"))
    return schema


def released_schemas() -> Iterator[tuple[str, str, Schema]]:
    """(version, event type, schema) for every released schema."""
    for vdir in sorted(p for p in RELEASED.iterdir() if p.is_dir()):
        for path in sorted(vdir.glob("*.avsc")):
            yield vdir.name, path.stem, load(path)


RELEASED_CASES = [
    pytest.param(name, schema, id=f"{version}-{name}")
    for version, name, schema in released_schemas()
]


# --- the schemas match the event classes --------------------------------------------------


def expected_avro_type(field_name: str, tp: Any) -> Any:
    if field_name == "schema_version":
        return "int"
    types: dict[Any, Any] = {
        str: "string",
        int: "long",
        bool: "boolean",
        bytes: "bytes",
        str | None: ["null", "string"],
        int | None: ["null", "long"],
        bool | None: ["null", "boolean"],
        tuple[str, ...]: {"type": "array", "items": "string"},
    }
    assert tp in types, f"{field_name}: no Avro mapping for {tp!r}"
    return types[tp]


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda c: c.__name__)
def test_current_schema_matches_event_class(cls: type[Event]) -> None:
    schema = load(SCHEMAS / f"{cls.__name__}.avsc")
    assert schema["type"] == "record"
    assert (schema["namespace"], schema["name"]) == ("callgate.events", cls.__name__)
    fields = {f["name"]: f for f in schema["fields"]}
    assert len(fields) == len(schema["fields"]), "duplicate field names"
    assert tuple(f["name"] for f in schema["fields"][: len(ENVELOPE)]) == ENVELOPE
    assert fields["event_type"] == {**fields["event_type"], "type": "string"}
    assert fields["event_type"]["default"] == cls.__name__

    hints = typing.get_type_hints(cls)
    class_fields = {f.name: f for f in dataclasses.fields(cls)}
    assert set(fields) - {"event_type"} == set(class_fields)
    for name, field in class_fields.items():
        avro = fields[name]
        assert avro["type"] == expected_avro_type(name, hints[name]), name
        has_default = field.default is not dataclasses.MISSING
        assert ("default" in avro) == has_default, f"{name}: optionality differs"
        if has_default:
            # A list default is held as a tuple on the (immutable) event.
            default = list(field.default) if isinstance(field.default, tuple) else field.default
            assert avro["default"] == default, f"{name}: default differs"


def test_every_schema_file_has_an_event_class() -> None:
    assert {p.stem for p in SCHEMAS.glob("*.avsc")} == {cls.__name__ for cls in EVENT_TYPES}


def test_every_event_type_has_a_released_version() -> None:
    """Anything a producer can write must be in the compatibility baseline."""
    released = {name for _, name, _ in released_schemas()}
    assert released == {cls.__name__ for cls in EVENT_TYPES}
    assert all(p.name.startswith("v") and p.name[1:].isdigit() for p in RELEASED.iterdir())


@pytest.mark.parametrize(("name", "schema"), RELEASED_CASES)
def test_released_schema_names_its_file(name: str, schema: Schema) -> None:
    assert (schema["namespace"], schema["name"]) == ("callgate.events", name)
    parse_schema(schema)


# --- the compatibility checker -------------------------------------------------------------


def _variants(schema: Any) -> list[Any]:
    """Edge values for one Avro type: empty, extreme and non-ASCII values, both union sides."""
    if isinstance(schema, list):
        return [v for branch in schema for v in _variants(branch)]
    if isinstance(schema, dict) and schema["type"] == "array":
        return [[], [v for v in _variants(schema["items"]) if v is not None]]
    if isinstance(schema, dict) and schema["type"] == "record":  # nested (view schemas)
        return sample_records(schema)
    kind = schema["type"] if isinstance(schema, dict) else schema
    values: dict[str, list[Any]] = {
        "null": [None],
        "string": ["", "x", "Grüße €"],
        "bytes": [b"", b"\x00\xff"],
        "boolean": [False, True],
        "int": [0, -(2**31), 2**31 - 1],
        "long": [0, -(2**63), 2**63 - 1],
    }
    assert kind in values, f"extend the compatibility checker for Avro type {kind!r}"
    return values[kind]


def sample_records(schema: Schema) -> list[dict[str, Any]]:
    """Records that together use every edge value of every field (the longest list decides)."""
    options = {f["name"]: _variants(f["type"]) for f in schema["fields"]}
    count = max(len(v) for v in options.values())
    return [{name: vals[i % len(vals)] for name, vals in options.items()} for i in range(count)]


def read_back_problems(writer: Schema, reader: Schema) -> list[str]:
    """Write samples with ``writer``, read them with ``reader``; every field must survive.

    Fields the reader shares with the writer keep the written value; fields only the reader
    has take the reader's default. Resolution errors are reported, not raised.
    """
    parsed_writer, parsed_reader = parse_schema(writer), parse_schema(reader)
    writer_fields = {f["name"] for f in writer["fields"]}
    problems = []
    for record in sample_records(writer):
        buffer = io.BytesIO()
        schemaless_writer(buffer, parsed_writer, record)
        buffer.seek(0)
        try:
            read = schemaless_reader(buffer, parsed_writer, parsed_reader)
        except Exception as exc:
            return [f"{type(exc).__name__}: {exc}"]
        assert isinstance(read, dict)
        for field in reader["fields"]:
            name = field["name"]
            written = record[name] if name in writer_fields else field.get("default")
            expected = as_read(field["type"], written)
            if read.get(name) != expected:
                problems.append(f"{name}: wrote {expected!r}, read {read.get(name)!r}")
    return problems


def as_read(schema: Any, value: Any) -> Any:
    """``value`` as a reader of ``schema`` sees it: in nested records (view schemas) the
    fields the reader lacks dropped and those only it has at their default."""
    if isinstance(schema, list):
        records = [b for b in schema if isinstance(b, dict) and b["type"] == "record"]
        return as_read(records[0], value) if records and isinstance(value, dict) else value
    if isinstance(schema, dict) and schema["type"] == "array" and isinstance(value, list):
        return [as_read(schema["items"], v) for v in value]
    if isinstance(schema, dict) and schema["type"] == "record" and isinstance(value, dict):
        return {
            f["name"]: as_read(f["type"], value[f["name"]]) if f["name"] in value else f["default"]
            for f in schema["fields"]
        }
    return value


def compatibility_problems(old: Schema, new: Schema) -> list[str]:
    """Backward: the new schema reads old data. Forward: the old schema reads new data."""
    backward = [f"backward: {p}" for p in read_back_problems(writer=old, reader=new)]
    forward = [f"forward: {p}" for p in read_back_problems(writer=new, reader=old)]
    return backward + forward


@pytest.mark.parametrize(("name", "released"), RELEASED_CASES)
def test_current_schema_is_compatible_with_released_version(name: str, released: Schema) -> None:
    current = load(SCHEMAS / f"{name}.avsc")
    assert compatibility_problems(old=released, new=current) == []


# --- view schemas (schemas/views, ADR 0016): released versions under the same check -------

VIEWS = SCHEMAS / "views"
VIEW_RELEASED_CASES = [
    pytest.param(path.stem, load(path), id=f"{vdir.name}-view-{path.stem}")
    for vdir in sorted(p for p in (VIEWS / "released").iterdir() if p.is_dir())
    for path in sorted(vdir.glob("*.avsc"))
]


def test_every_view_schema_has_a_released_version() -> None:
    released = {case.values[0] for case in VIEW_RELEASED_CASES}
    assert released == {p.stem for p in VIEWS.glob("*.avsc")}


@pytest.mark.parametrize(("view", "released"), VIEW_RELEASED_CASES)
def test_current_view_schema_is_compatible_with_released_version(
    view: str, released: Schema
) -> None:
    current = load(VIEWS / f"{view}.avsc")
    assert (current["namespace"], current["name"]) == ("callgate.views", released["name"])
    assert compatibility_problems(old=released, new=current) == []


def test_checker_detects_an_incompatible_view_change() -> None:
    """The check reaches into nested records: a required field added deep inside fails."""
    old = load(VIEWS / "status.avsc")
    new = copy.deepcopy(old)
    error = next(f for f in new["fields"] if f["name"] == "error")
    error["type"][1]["fields"].append({"name": "hint", "type": "string"})
    problems = compatibility_problems(old=old, new=new)
    assert any(p.startswith("backward: ") for p in problems), problems


# --- the checker can fail ------------------------------------------------------------------

BASE = load(SCHEMAS / "ApprovalDenied.avsc")


def _edited(edit: Edit) -> Schema:
    schema = copy.deepcopy(BASE)
    edit(schema["fields"])
    return schema


def _field(fields: list[Schema], name: str) -> Schema:
    return next(f for f in fields if f["name"] == name)


INCOMPATIBLE: dict[str, tuple[Edit, str]] = {
    "add field without default": (
        lambda fields: fields.append({"name": "ticket", "type": "string"}),
        "backward: ",
    ),
    "remove field without default": (
        lambda fields: fields.remove(_field(fields, "reason")),
        "forward: ",
    ),
    "change field type": (
        lambda fields: _field(fields, "reason").update(type="long"),
        "backward: ",
    ),
    "make required field nullable": (
        lambda fields: _field(fields, "reason").update(type=["null", "string"]),
        "forward: ",
    ),
    "narrow long to int": (
        lambda fields: _field(fields, "occurred_at").update(type="int"),
        "backward: ",
    ),
}


@pytest.mark.parametrize(("edit", "direction"), list(INCOMPATIBLE.values()), ids=list(INCOMPATIBLE))
def test_checker_detects_incompatible_change(edit: Edit, direction: str) -> None:
    problems = compatibility_problems(old=BASE, new=_edited(edit))
    assert any(p.startswith(direction) for p in problems), problems


def test_checker_accepts_adding_an_optional_field() -> None:
    """The positive control: the compatible way to grow an event passes both directions."""
    new = _edited(
        lambda fields: fields.append(
            {"name": "ticket", "type": ["null", "string"], "default": None}
        )
    )
    assert compatibility_problems(old=BASE, new=new) == []
