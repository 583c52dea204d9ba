"""Avro codec for callgate events: single-object encoding over schema-first ``.avsc`` files.

Wire format (Avro spec, "Single object encoding"; see docs/adr/0004):
``C3 01`` marker, then the 8-byte little-endian CRC-64-AVRO fingerprint of the writer
schema's parsing canonical form, then the schemaless Avro body. The fingerprint names the
writer schema, so every released version stays decodable and is resolved to the current
(reader) schema; events evolve only in compatible ways (docs/contract.md "Shape").

Schema directory layout: ``<dir>/<EventType>.avsc`` holds the current schema of each event
type (the source of truth; tests keep ``callgate.domain.events`` in line with it), and
``<dir>/released/<version>/<EventType>.avsc`` every schema version that was ever released.

Any undecodable input raises ``MalformedEvent``; the caller dead-letters it with code
``malformed_event`` (the first check in docs/contract.md "Order of checks") instead of skipping it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import operator
import sys
import typing
from collections.abc import Callable, Mapping
from io import BytesIO
from pathlib import Path
from typing import Any, cast

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import to_parsing_canonical_form

from callgate.domain.events import BY_NAME, Event

MARKER = b"\xc3\x01"
HEADER_LEN = 10  # marker + 8-byte fingerprint
NAMESPACE = "callgate.events"  # the Avro namespace (not the Python module)
RELEASED_DIR = "released"

Schema = dict[str, Any]


class MalformedEvent(ValueError):
    """Bytes that are not a valid callgate event (or an event that cannot be encoded)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SchemaSetError(ValueError):
    """The schema directory is incomplete or disagrees with ``callgate.domain.events``."""


_CRC64_EMPTY = 0xC15D213AA4D7A795  # the Avro spec's CRC-64-AVRO of the empty input


def _crc64_avro_table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_CRC64_EMPTY & -(fp & 1))
        table.append(fp)
    return tuple(table)


# Built once: fastavro's ``fingerprint`` builds this table on every call, which made
# fingerprinting the 70 shipped schemas cost about 30 ms at the start of every process.
_CRC64_TABLE = _crc64_avro_table()


def schema_fingerprint(schema: Schema | str) -> bytes:
    """The 8 fingerprint bytes of the single-object header: CRC-64-AVRO of the schema's
    parsing canonical form, little-endian as Java and the spec write it."""
    return _crc64_avro(to_parsing_canonical_form(schema))


@functools.lru_cache(maxsize=1024)
def _crc64_avro(canonical: str) -> bytes:
    """Once per distinct canonical form: most released schema versions have the form of
    another (the 141 shipped schemas have 63), and the CRC, a Python loop over every byte,
    was most of a codec's construction, paid by every process at start."""
    fp = _CRC64_EMPTY
    table = _CRC64_TABLE
    for byte in canonical.encode():
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


@dataclasses.dataclass(frozen=True, slots=True)
class _Encoder:
    header: bytes
    schema: Any  # parsed by fastavro
    fields: tuple[str, ...]  # record field names, in schema order
    # The event's values of ``fields``, in that order, read in C (``operator.attrgetter``).
    values: Callable[[Event], tuple[Any, ...]]


class _Decoder:
    """How to decode one writer schema. What builds the event from the record is made at
    the first decode of its class (``prepare``): a process decodes a few of the 60-odd
    classes, and making them all cost every process ~20 ms at start."""

    __slots__ = ("event_cls", "make", "reader", "tuple_fields", "version", "writer")

    def __init__(self, event_cls: type[Event], version: str, writer: Any, reader: Any) -> None:
        self.event_cls = event_cls
        self.version = version
        self.writer = writer  # parsed writer schema
        self.reader = reader  # parsed current schema, or None when the writer is current
        # Avro arrays that the event holds as tuples, and ``event_cls(**record)``, faster
        # (``_maker``): None until ``prepare``.
        self.tuple_fields: tuple[str, ...] = ()
        self.make: Callable[[dict[str, Any]], Event] | None = None

    def prepare(self) -> Callable[[dict[str, Any]], Event]:
        self.tuple_fields = _tuple_fields(self.event_cls)
        make = self.make = _maker(self.event_cls)
        return make


class AvroCodec:
    """Encodes events with their current schema; decodes any registered schema version."""

    def __init__(
        self, current: Mapping[str, Schema], released: Mapping[str, Mapping[str, Schema]]
    ) -> None:
        """``current``: event type -> schema; ``released``: version -> event type -> schema."""
        _check_current(current)
        self._encoders: dict[type[Event], _Encoder] = {}
        self._decoders: dict[bytes, _Decoder] = {}
        readers: dict[str, Any] = {}
        for name, schema in current.items():
            cls = BY_NAME[name]
            interned = _interned(schema)
            parsed = readers[name] = _parse(interned, name)
            fp = schema_fingerprint(schema)
            fields = tuple(f["name"] for f in interned["fields"])
            self._encoders[cls] = _Encoder(MARKER + fp, parsed, fields, _values(fields))
            decoder = _Decoder(cls, "current", parsed, None)
            self._register(fp, decoder)
        for version, schemas in sorted(released.items()):
            for name, schema in schemas.items():
                where = f"{RELEASED_DIR}/{version}/{name}"
                _field_names(schema, where)
                if name not in current or schema.get("name") != name:
                    raise SchemaSetError(f"{where} does not match a current event schema")
                fp = schema_fingerprint(schema)
                if fp in self._decoders:
                    continue  # same canonical form as a version already registered
                cls = BY_NAME[name]
                parsed = _parse(_interned(schema), where)
                decoder = _Decoder(cls, version, parsed, readers[name])
                self._register(fp, decoder)

    def _register(self, fp: bytes, decoder: _Decoder) -> None:
        other = self._decoders.get(fp)
        if other is not None and other.event_cls is not decoder.event_cls:
            raise SchemaSetError(f"fingerprint collision: {other.event_cls.__name__}")
        self._decoders[fp] = decoder

    @classmethod
    def from_directory(cls, path: str | Path) -> AvroCodec:
        return cls(*load_schema_directory(Path(path)))

    @classmethod
    def default(cls) -> AvroCodec:
        """The schemas shipped with callgate: ``callgate/_schemas`` (installed package data),
        else the repository's ``schemas/`` (source checkout). One shared instance: a codec
        never changes after construction, and loading takes ~20 ms."""
        return _default_codec()

    def encode(self, event: Event) -> bytes:
        encoder = self._encoders.get(type(event))
        if encoder is None:
            raise MalformedEvent(f"no Avro schema for {type(event).__name__}")
        if not -(2**31) <= event.schema_version < 2**31:
            # Avro "int" is 32-bit; fastavro would write a wider varint that other readers reject.
            raise MalformedEvent(f"cannot encode {event.event_type}: schema_version out of range")
        record = dict(zip(encoder.fields, encoder.values(event), strict=True))
        out = BytesIO()
        out.write(encoder.header)
        try:
            schemaless_writer(out, encoder.schema, record, disable_tuple_notation=True)
        except Exception as exc:
            raise MalformedEvent(f"cannot encode {event.event_type}: {_describe(exc)}") from exc
        return out.getvalue()

    def event_type_of(self, data: bytes) -> str | None:
        """The event type named by the header, without decoding the body; None if unknown."""
        cls = self.event_class_of(data)
        return None if cls is None else cls.__name__

    def event_class_of(self, data: bytes) -> type[Event] | None:
        """The event class named by the header, without decoding the body; None if unknown.
        Only a claim: the body may still be corrupt (``decode`` says)."""
        if not isinstance(data, bytes) or len(data) < HEADER_LEN or data[:2] != MARKER:
            return None
        decoder = self._decoders.get(data[2:HEADER_LEN])
        return None if decoder is None else decoder.event_cls

    def decode(self, data: bytes) -> Event:
        """Decode one event; every failure is a ``MalformedEvent`` with the reason."""
        if not isinstance(data, bytes):
            if not isinstance(data, bytearray | memoryview):
                raise MalformedEvent(f"expected bytes, got {type(data).__name__}")
            data = bytes(data)
        if len(data) < HEADER_LEN:
            raise MalformedEvent(f"too short for a single-object header: {len(data)} bytes")
        if data[:2] != MARKER:
            raise MalformedEvent(f"not Avro single-object encoding: marker {data[:2].hex()}")
        fingerprint = data[2:HEADER_LEN]
        decoder = self._decoders.get(fingerprint)
        if decoder is None:
            raise MalformedEvent(f"unknown schema fingerprint {fingerprint.hex()}")
        body = BytesIO(data)
        body.seek(HEADER_LEN)
        try:
            record = schemaless_reader(body, decoder.writer, decoder.reader)
        except Exception as exc:
            name = decoder.event_cls.__name__
            reason = f"corrupt {name} ({decoder.version} schema) body: {_describe(exc)}"
            raise MalformedEvent(reason) from None
        if body.tell() != len(data):
            name = decoder.event_cls.__name__
            raise MalformedEvent(f"{len(data) - body.tell()} trailing bytes after {name} body")
        return _build(decoder, record)


@functools.cache
def _default_codec() -> AvroCodec:
    package = Path(__file__).resolve().parent.parent
    candidates = (package / "_schemas", package.parent.parent / "schemas")
    for candidate in candidates:
        if (candidate / "ToolCallProposed.avsc").is_file():
            return AvroCodec.from_directory(candidate)
    raise SchemaSetError(f"no callgate schemas found in {[str(c) for c in candidates]}")


def _build(decoder: _Decoder, record: Any) -> Event:
    name = decoder.event_cls.__name__
    if not isinstance(record, dict):
        raise MalformedEvent(f"{name} body is not a record")
    event_type = record.pop("event_type", None)
    if event_type != name:
        raise MalformedEvent(f"event_type {event_type!r} contradicts the {name} schema")
    try:
        make = decoder.make
        if make is None:
            make = decoder.prepare()
        for field in decoder.tuple_fields:
            record[field] = tuple(record[field])
        return make(record)
    except Exception as exc:
        raise MalformedEvent(f"{name} body does not build an event: {_describe(exc)}") from None


def _maker(cls: type[Event]) -> Callable[[dict[str, Any]], Event]:
    """``cls(**record)`` for a record of exactly ``cls``'s fields, in half the time.

    A frozen slotted dataclass's ``__init__`` binds every keyword, then stores each field
    with ``object.__setattr__``; ``make`` stores each field through its slot descriptor in
    straight-line code generated once per class, as ``dataclasses`` generates ``__init__``:
    the same object (events have no ``__post_init__``; a class with one keeps ``cls(**r)``).
    A record with a field more raises TypeError, one with a field less KeyError.
    """
    if hasattr(cls, "__post_init__"):
        return lambda record: cls(**record)
    names = [f.name for f in dataclasses.fields(cls)]
    scope: dict[str, Any] = {"new": object.__new__, "cls": cls, "fields": len(names)}
    lines = [
        "def make(record):",
        "    if len(record) != fields:",
        "        raise TypeError(f'{len(record)} fields for {fields}')",
        "    event = new(cls)",
    ]
    for index, name in enumerate(names):
        scope[f"set{index}"] = getattr(cls, name).__set__
        lines.append(f"    set{index}(event, record[{name!r}])")
    lines.append("    return event")
    exec("\n".join(lines), scope)
    return cast(Callable[[dict[str, Any]], Event], scope["make"])


def _values(fields: tuple[str, ...]) -> Callable[[Event], tuple[Any, ...]]:
    """A getter of ``fields``' values as a tuple (``attrgetter`` of one name gives the
    value itself, so that case is wrapped)."""
    if len(fields) == 1:
        one = operator.attrgetter(fields[0])
        return lambda event: (one(event),)
    return cast(Callable[[Event], tuple[Any, ...]], operator.attrgetter(*fields))


def _interned(schema: Schema) -> Schema:
    """Intern the field names: decoded records are passed as ``**kwargs``, and CPython matches
    keyword names by identity first, by string comparison on a miss (measured: building a
    25-field event from a record with non-interned keys took twice as long)."""
    fields = [{**f, "name": sys.intern(f["name"])} for f in schema["fields"]]
    return {**schema, "fields": fields}


def _parse(schema: Schema, where: str) -> Any:
    try:
        return parse_schema(schema)
    except Exception as exc:
        raise SchemaSetError(f"{where}: invalid Avro schema: {exc}") from exc


def _describe(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def load_schema_directory(root: Path) -> tuple[dict[str, Schema], dict[str, dict[str, Schema]]]:
    """``root``'s current schemas by file stem, and each ``released/<version>``'s."""
    current = {p.stem: _load(p) for p in sorted(root.glob("*.avsc"))}
    released: dict[str, dict[str, Schema]] = {}
    for vdir in sorted((root / RELEASED_DIR).glob("*")):
        if vdir.is_dir():
            released[vdir.name] = {p.stem: _load(p) for p in sorted(vdir.glob("*.avsc"))}
    return current, released


def _load(path: Path) -> Schema:
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SchemaSetError(f"{path}: {exc}") from exc
    if not isinstance(schema, dict):
        raise SchemaSetError(f"{path}: not a record schema")
    return schema


def _check_current(current: Mapping[str, Schema]) -> None:
    """Fail at startup, not on every decode, if the schemas and the event classes disagree."""
    missing = sorted(set(BY_NAME) - set(current))
    if missing:
        raise SchemaSetError(f"no current schema for {missing}")
    for name, schema in current.items():
        if name not in BY_NAME:
            raise SchemaSetError(f"schema {name} has no event class in callgate.domain.events")
        if schema.get("name") != name or schema.get("namespace") != NAMESPACE:
            raise SchemaSetError(f"schema {name} must be record {NAMESPACE}.{name}")
        fields = set(_field_names(schema, name))
        expected = {f.name for f in dataclasses.fields(BY_NAME[name])} | {"event_type"}
        if fields != expected:
            raise SchemaSetError(f"schema {name} fields differ from the class: {fields ^ expected}")


def _field_names(schema: Schema, where: str) -> list[str]:
    fields = schema.get("fields")
    if schema.get("type") != "record" or not isinstance(fields, list):
        raise SchemaSetError(f"{where}: not an Avro record schema")
    if not all(isinstance(f, dict) and isinstance(f.get("name"), str) for f in fields):
        raise SchemaSetError(f"{where}: every field needs a name")
    return [f["name"] for f in fields]


def _tuple_fields(cls: type[Event]) -> tuple[str, ...]:
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    return tuple(f.name for f in fields if typing.get_origin(hints[f.name]) is tuple)


__all__ = ["MARKER", "AvroCodec", "MalformedEvent", "SchemaSetError", "schema_fingerprint"]
