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
from collections.abc import Mapping
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, Protocol

import orjson
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from callgate.adapters.avro_codec import HEADER_LEN, MARKER, RELEASED_DIR, schema_fingerprint
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
            self._writers[view] = _Writer(MARKER + fp, schema, parsed)
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
        root = Path(path)
        current = {p.stem: _load(p) for p in sorted(root.glob("*.avsc"))}
        released: dict[str, dict[str, Schema]] = {}
        for vdir in sorted((root / RELEASED_DIR).glob("*")):
            if vdir.is_dir():
                released[vdir.name] = {p.stem: _load(p) for p in sorted(vdir.glob("*.avsc"))}
        return cls(current, released)

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
        record = to_avro(writer.schema, _parse(value_json), view)
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


def to_avro(schema: Any, value: Any, where: str) -> Any:
    """The Avro datum of a JSON value under ``schema`` (module docstring's rule)."""
    if isinstance(schema, list):  # a union: ["null", X]
        if value is None:
            if "null" not in schema:
                raise ViewSchemaError(f"{where}: null where {schema} is expected")
            return None
        (branch,) = [s for s in schema if s != "null"]
        return to_avro(branch, value, where)
    kind = schema["type"] if isinstance(schema, dict) else schema
    if kind == "record":
        if not isinstance(value, dict):
            raise ViewSchemaError(f"{where}: expected an object")
        names = {_json_name(f["name"]) for f in schema["fields"]}
        if set(value) != names:
            raise ViewSchemaError(f"{where}: fields differ from the schema: {set(value) ^ names}")
        record: dict[str, Any] = {}
        for f in schema["fields"]:
            name = f["name"]
            item = value[_json_name(name)]
            if name.endswith(JSON_SUFFIX):
                record[name] = None if item is None else canonical_json(item)
                if item is None and "null" not in f["type"]:
                    raise ViewSchemaError(f"{where}.{name}: null where JSON is expected")
            else:
                record[name] = to_avro(f["type"], item, f"{where}.{name}")
        return record
    if kind == "array":
        if not isinstance(value, list):
            raise ViewSchemaError(f"{where}: expected an array")
        return [to_avro(schema["items"], v, where) for v in value]
    expected = _PRIMITIVES.get(kind)
    if expected is None:
        raise ViewSchemaError(f"{where}: unsupported Avro type {kind!r}")
    if type(value) is not expected:  # exact: bool is not a long, int is not a boolean
        raise ViewSchemaError(f"{where}: expected {kind}, got {type(value).__name__}")
    return value


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


def _load(path: Path) -> Schema:
    schema: Schema = json.loads(path.read_text(encoding="utf-8"))
    return schema


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
