"""Avro codec for view values: the published form of every ``view.*`` topic (ADR 0016).

A projection emits a view value as a JSON object (``ViewRecord.value_json``; the embedded
backend stores exactly that). On Kafka the value is Avro in single-object encoding, like
the events (ADR 0004): ``C3 01``, the CRC-64-AVRO fingerprint of the writer schema, the
schemaless body. Schemas: ``schemas/views/<view>.avsc`` (current) and
``schemas/views/released/<version>/<view>.avsc`` (every released version, still decodable).

The JSON object and the Avro record correspond field for field, with one rule: a field
whose value is free-form JSON (arguments, dry-run snapshots, results, error details) is the
Avro field ``<name>_json`` holding its canonical JSON text, and ``null`` for ``None``. So
``decode(encode(v))`` is ``v`` again, and its canonical JSON is the same text: replay
compares Kafka views with rebuilt ones byte for byte, and an audit record's hash can be
recomputed from the Avro form (README "Views").

Strict both ways: a value with a field the schema lacks, or lacking one it has, or of
another type, raises ``ViewSchemaError``; the projections' tests encode every record they
emit, so a projection cannot drift from its published schema.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, Protocol

import orjson
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from callgate.adapters.avro_codec import (
    HEADER_LEN,
    MARKER,
    RELEASED_DIR,
    load_schema_directory,
    schema_fingerprint,
)
from callgate.domain.canonical import canonical_json

NAMESPACE = "callgate.views"
VIEWS_DIR = "views"
JSON_SUFFIX = "_json"

Schema = dict[str, Any]


class ViewEncoder(Protocol):
    """How a runner turns a view value into Kafka record bytes."""

    def encode(self, view: str, value_json: str) -> bytes: ...


class JsonViews:
    """View values as their JSON text: for processes whose views have no published schema
    (the runner tests' toy processes). callgate's own views always use ``ViewCodec``."""

    def encode(self, view: str, value_json: str) -> bytes:
        return value_json.encode()


class ViewSchemaError(ValueError):
    """A view value that does not fit its schema, or bytes that are not a view value."""


@dataclass(frozen=True, slots=True)
class _Writer:
    header: bytes
    schema: Schema  # the .avsc, as loaded (drives the JSON <-> Avro conversion)
    parsed: Any
    convert: Callable[[Any], Any]  # ``converter(schema)``


@dataclass(frozen=True, slots=True)
class _Reader:
    view: str
    version: str
    writer: Any
    reader: Any  # the current schema, or None when the writer is the current one
    current: Schema


class ViewCodec:
    """Encodes view values with their current schema; decodes every released version."""

    def __init__(
        self, current: Mapping[str, Schema], released: Mapping[str, Mapping[str, Schema]]
    ) -> None:
        self._writers: dict[str, _Writer] = {}
        self._readers: dict[bytes, _Reader] = {}
        for view, schema in current.items():
            if schema.get("namespace") != NAMESPACE or schema.get("type") != "record":
                raise ViewSchemaError(f"view schema {view} must be a record in {NAMESPACE}")
            parsed = parse_schema(schema)
            fp = schema_fingerprint(schema)
            self._writers[view] = _Writer(MARKER + fp, schema, parsed, converter(schema, view))
            self._readers[fp] = _Reader(view, "current", parsed, None, schema)
        for version, schemas in sorted(released.items()):
            for view, schema in schemas.items():
                if view not in current or schema.get("name") != current[view].get("name"):
                    raise ViewSchemaError(f"{RELEASED_DIR}/{version}/{view} has no current view")
                fp = schema_fingerprint(schema)
                if fp not in self._readers:
                    w = self._writers[view]
                    reader = _Reader(view, version, parse_schema(schema), w.parsed, w.schema)
                    self._readers[fp] = reader

    @classmethod
    def from_directory(cls, path: str | Path) -> ViewCodec:
        return cls(*load_schema_directory(Path(path)))

    @classmethod
    def default(cls) -> ViewCodec:
        """The view schemas shipped with callgate (package data, else the checkout's)."""
        return _default_codec()

    @property
    def views(self) -> frozenset[str]:
        return frozenset(self._writers)

    def schema(self, view: str) -> Schema:
        return self._writers[view].schema

    def encode(self, view: str, value_json: str) -> bytes:
        """The Avro form of one view value (a ``ViewRecord.value_json``)."""
        writer = self._writers.get(view)
        if writer is None:
            raise ViewSchemaError(f"no published schema for view {view!r}")
        record = writer.convert(_parse(value_json))
        out = BytesIO()
        out.write(writer.header)
        schemaless_writer(out, writer.parsed, record)
        return out.getvalue()

    def decode(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """``(view, value)``: the view named by the fingerprint and its JSON-object value."""
        if len(data) < HEADER_LEN or data[:2] != MARKER:
            raise ViewSchemaError("not Avro single-object encoding")
        reader = self._readers.get(bytes(data[2:HEADER_LEN]))
        if reader is None:
            raise ViewSchemaError(f"unknown view schema fingerprint {data[2:HEADER_LEN].hex()}")
        body = BytesIO(data)
        body.seek(HEADER_LEN)
        try:
            record = schemaless_reader(body, reader.writer, reader.reader)
        except Exception as exc:
            raise ViewSchemaError(f"corrupt {reader.view} value: {exc}") from None
        return reader.view, from_avro(reader.current, record)

    def decode_json(self, data: bytes) -> tuple[str, str]:
        """``(view, value_json)``: the canonical JSON text the projection emitted."""
        view, value = self.decode(data)
        return view, canonical_json(value)


Converter = Callable[[Any], Any]


def to_avro(schema: Any, value: Any, where: str) -> Any:
    """The Avro datum of a JSON value under ``schema`` (module docstring's rule)."""
    return converter(schema, where)(value)


def converter(schema: Any, where: str, namespace: str = NAMESPACE) -> Converter:
    """``to_avro`` for one schema, built once: a view value is converted without walking
    the schema again (the runner encodes every view record). A record inside a union is
    written in fastavro's tuple notation, ``(full name, datum)``, so that fastavro picks
    the branch by name instead of validating the datum against each branch."""
    if isinstance(schema, list):  # a union: ["null", X]
        (branch,) = [s for s in schema if s != "null"]
        inner = converter(branch, where, namespace)
        nullable = "null" in schema
        tag = _record_name(branch, namespace)

        def union(value: Any) -> Any:
            if value is None:
                if not nullable:
                    raise ViewSchemaError(f"{where}: null where {schema} is expected")
                return None
            datum = inner(value)
            return datum if tag is None else (tag, datum)

        return union
    kind = schema["type"] if isinstance(schema, dict) else schema
    if kind == "record":
        return _record_converter(schema, where, schema.get("namespace", namespace))
    if kind == "array":
        item = converter(schema["items"], where, namespace)

        def array(value: Any) -> Any:
            if type(value) is not list:
                raise ViewSchemaError(f"{where}: expected an array")
            return [item(v) for v in value]

        return array
    expected = _PRIMITIVES.get(kind)
    if expected is None:
        raise ViewSchemaError(f"{where}: unsupported Avro type {kind!r}")

    def primitive(value: Any) -> Any:
        if type(value) is not expected:  # exact: bool is not a long, int is not a boolean
            raise ViewSchemaError(f"{where}: expected {kind}, got {type(value).__name__}")
        return value

    return primitive


def _record_converter(schema: Schema, where: str, namespace: str) -> Converter:
    fields: list[tuple[str, str, Converter]] = []
    for f in schema["fields"]:
        name = f["name"]
        at = f"{where}.{name}"
        if name.endswith(JSON_SUFFIX):
            fields.append((name, _json_name(name), _json_text("null" in f["type"], at)))
        else:
            fields.append((name, name, converter(f["type"], at, namespace)))
    names = frozenset(j for _, j, _ in fields)

    def record(value: Any) -> Any:
        if type(value) is not dict:
            raise ViewSchemaError(f"{where}: expected an object")
        if value.keys() != names:
            raise ViewSchemaError(f"{where}: fields differ from the schema: {set(value) ^ names}")
        return {name: convert(value[key]) for name, key, convert in fields}

    return record


def _json_text(nullable: bool, where: str) -> Converter:
    def text(value: Any) -> Any:
        if value is None:
            if not nullable:
                raise ViewSchemaError(f"{where}: null where JSON is expected")
            return None
        return canonical_json(value)

    return text


def _record_name(schema: Any, namespace: str) -> str | None:
    if not (isinstance(schema, dict) and schema.get("type") == "record"):
        return None
    name = str(schema["name"])
    return name if "." in name else f"{schema.get('namespace', namespace)}.{name}"


def from_avro(schema: Any, datum: Any) -> Any:
    """The JSON value of an Avro datum under ``schema``: the inverse of ``to_avro``."""
    if isinstance(schema, list):
        if datum is None:
            return None
        (branch,) = [s for s in schema if s != "null"]
        return from_avro(branch, datum)
    kind = schema["type"] if isinstance(schema, dict) else schema
    if kind == "record":
        value: dict[str, Any] = {}
        for f in schema["fields"]:
            name, item = f["name"], datum[f["name"]]
            if name.endswith(JSON_SUFFIX):
                value[_json_name(name)] = None if item is None else json.loads(item)
            else:
                value[name] = from_avro(f["type"], item)
        return value
    if kind == "array":
        return [from_avro(schema["items"], v) for v in datum]
    return datum


_PRIMITIVES: dict[str, type] = {"string": str, "long": int, "boolean": bool}


def _parse(value_json: str) -> Any:
    try:
        return orjson.loads(value_json)
    except orjson.JSONDecodeError:  # e.g. an integer beyond 64 bits: the slower parser
        return json.loads(value_json)


def _json_name(avro_name: str) -> str:
    return avro_name[: -len(JSON_SUFFIX)] if avro_name.endswith(JSON_SUFFIX) else avro_name


@functools.cache
def _default_codec() -> ViewCodec:
    package = Path(__file__).resolve().parent.parent
    for candidate in (
        package / "_schemas" / VIEWS_DIR,
        package.parent.parent / "schemas" / VIEWS_DIR,
    ):
        if (candidate / "pending.avsc").is_file():
            return ViewCodec.from_directory(candidate)
    raise ViewSchemaError("no callgate view schemas found")


__all__ = [
    "NAMESPACE",
    "JsonViews",
    "ViewCodec",
    "ViewEncoder",
    "ViewSchemaError",
    "from_avro",
    "to_avro",
]
