"""Audit export (C9 for SIEMs): audit records as JSON lines, and the check of such a file.

Pure formatting and checking; reading the views, the stored position and the output file
are the adapter's (``callgate.adapters.audit_export``).

One line per audit record, in one of two formats:

- ``cloudevents``: a CloudEvents 1.0 event in structured mode (JSON format), written by
  the ``cloudevents`` SDK. ``id`` is the record's key (``partition_key:seq``, unique for
  the ``source``), ``subject`` the invocation, ``time`` its ``occurred_at``; ``data`` is
  the audit record itself. The extensions ``callgateseq``, ``callgateprevhash`` and
  ``callgatehash`` repeat the chain fields for a router that does not open ``data``.
- ``ocsf``: an OCSF API Activity event (class 6003, category 6): the principal as
  ``actor.user``, the tool as ``api.operation``, the outcome as ``status``; the audit
  record itself under ``unmapped.callgate_audit``.

Either way the line carries the whole record with its ``seq``, ``prev_hash`` and
``hash``, and a ``link``: the SHA-256 of the line written before it (``GENESIS`` for an
exporter's first line; a resumed exporter continues its links). Most chains are short (a
partition key is one idempotency key), so the chains alone cannot show a line removed
from a file; the links can. A file checks on its own (``verify_lines``): each record's
hash, each chain's continuity, each line's link to the line before it, and that the
envelope is the one the record formats to (an edited ``time`` or ``actor`` is found as
surely as an edited record). A file that starts a chain after its first record (an export
resumed or limited by ``--since``) trusts that first record's ``prev_hash``, and a file
that starts with a resumed exporter's line trusts its link; the check says so
(``anchored``, ``continues``). Lines cut off the end of a file leave a shorter valid file:
compare its last record with ``callgate audit verify`` on the views.

Position: per partition key, the ``seq`` of the last record exported (``since_position``
starts one at a time instead of at the beginning). ``select`` returns
only records that continue a chain without a gap, so a record a reader has not seen yet
(a view read while another partition lags) holds back the records after it instead of
being skipped; ``advance`` moves the position past what was written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cloudevents.core.exceptions import BaseCloudEventException
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent

from callgate.domain.canonical import sha256_hex
from callgate.domain.codes import Code
from callgate_projections.audit import GENESIS, audit_key, record_hash

FORMATS = ("cloudevents", "ocsf")
CLOUDEVENT_SOURCE = "urn:callgate:audit"
CLOUDEVENT_TYPE = "io.callgate.audit.record"
OCSF_VERSION = "1.3.0"
OCSF_CLASS_UID = 6003  # API Activity
OCSF_CATEGORY_UID = 6  # Application Activity
OCSF_ACTIVITY_OTHER = 99
OCSF_RECORD_FIELD = "callgate_audit"
OCSF_LINK_FIELD = "callgate_link"
_SUCCESS = {Code.ALLOWED.value, Code.EXECUTED.value, Code.REPLAYED.value}
_JSON = JSONFormat()

Position = Mapping[str, int]


def _key(record: Mapping[str, Any]) -> str:
    return audit_key(str(record["partition_key"]), int(record["seq"]))


def _time(occurred_at_ms: int) -> datetime:
    return datetime.fromtimestamp(occurred_at_ms / 1000, tz=UTC)


def line_hash(line: str) -> str:
    """What the next line's ``link`` holds: SHA-256 of this line's text (no newline)."""
    return sha256_hex(line)


def cloudevent_line(record: Mapping[str, Any], link: str = GENESIS) -> str:
    """The record as one CloudEvents 1.0 structured-mode JSON line (no newline)."""
    attributes: dict[str, Any] = {
        "specversion": "1.0",
        "id": _key(record),
        "source": CLOUDEVENT_SOURCE,
        "type": CLOUDEVENT_TYPE,
        "subject": str(record["invocation_id"]),
        "time": _time(int(record["occurred_at"])),
        "datacontenttype": "application/json",
        "callgateseq": int(record["seq"]),
        "callgateprevhash": str(record["prev_hash"]),
        "callgatehash": str(record["hash"]),
        "callgatelink": link,
    }
    return _JSON.write(CloudEvent(attributes, dict(record))).decode()


def ocsf_event(record: Mapping[str, Any], link: str = GENESIS) -> dict[str, Any]:
    """The record as an OCSF API Activity event (a dict, ready for JSON)."""
    authorized = record.get("authorized_by") or {}
    principal = authorized.get("principal") or {}
    outcome = record.get("outcome")
    success = outcome in _SUCCESS
    occurred_at = int(record["occurred_at"])
    return {
        "class_uid": OCSF_CLASS_UID,
        "class_name": "API Activity",
        "category_uid": OCSF_CATEGORY_UID,
        "category_name": "Application Activity",
        "activity_id": OCSF_ACTIVITY_OTHER,
        "activity_name": "tool call",
        "type_uid": OCSF_CLASS_UID * 100 + OCSF_ACTIVITY_OTHER,
        "type_name": "API Activity: tool call",
        "time": occurred_at,
        "time_dt": _time(occurred_at).isoformat().replace("+00:00", "Z"),
        "severity_id": 1,
        "severity": "Informational",
        "status_id": 1 if success else 2,
        "status": "Success" if success else "Failure",
        "status_code": outcome,
        "message": f"{record.get('tool')}: {outcome}",
        "metadata": {
            "version": OCSF_VERSION,
            "product": {"name": "callgate", "vendor_name": "callgate"},
            "uid": _key(record),
            "correlation_uid": record["invocation_id"],
            "log_name": "audit",
            "tenant_uid": principal.get("tenant"),
        },
        "actor": _ocsf_actor(principal),
        "api": {
            "operation": record.get("tool"),
            "service": {"name": "callgate"},
            "request": {"uid": record["invocation_id"]},
        },
        "src_endpoint": {"svc_name": "callgate"},
        "cloud": {"provider": "callgate"},
        "unmapped": {OCSF_RECORD_FIELD: dict(record), OCSF_LINK_FIELD: link},
    }


def _ocsf_actor(principal: Mapping[str, Any]) -> dict[str, Any]:
    """OCSF's actor: the user, and the agent acting for them as the actor's application
    (the delegation chain travels in ``unmapped`` with the whole record)."""
    actor: dict[str, Any] = {
        "user": {
            "name": principal.get("user"),
            "uid": principal.get("user"),
            "groups": [{"name": role} for role in principal.get("roles") or []],
        },
    }
    if principal.get("agent"):
        actor["app_name"] = actor["app_uid"] = principal["agent"]
    return actor


def format_line(fmt: str, record: Mapping[str, Any], link: str = GENESIS) -> str:
    """One exported line of ``record`` in ``fmt`` (``FORMATS``), without the newline;
    ``link``: the previous line's ``line_hash`` (``GENESIS`` for a stream's first line)."""
    if fmt == "cloudevents":
        return cloudevent_line(record, link)
    if fmt == "ocsf":
        event = ocsf_event(record, link)
        return json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    raise ValueError(f"unknown export format {fmt!r} (one of {', '.join(FORMATS)})")


class NotAnExportLine(ValueError):
    """A line that is not an exported audit record in either format."""


def parse_line(line: str) -> tuple[str, dict[str, Any], dict[str, Any], str]:
    """``(format, record, envelope, link)`` of one exported line; ``NotAnExportLine``
    otherwise."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise NotAnExportLine(f"not JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise NotAnExportLine("not a JSON object")
    if "specversion" in obj:
        try:
            data = _JSON.read(None, line).get_data()
        except (BaseCloudEventException, ValueError, TypeError) as exc:
            raise NotAnExportLine(f"not a valid CloudEvent ({exc})") from exc
        fmt, record, link = "cloudevents", data, obj.get("callgatelink")
    elif obj.get("class_uid") == OCSF_CLASS_UID:
        unmapped = obj.get("unmapped") or {}
        fmt, record = "ocsf", unmapped.get(OCSF_RECORD_FIELD)
        link = unmapped.get(OCSF_LINK_FIELD)
    else:
        raise NotAnExportLine("neither a CloudEvent nor an OCSF API Activity event")
    if not isinstance(record, dict) or not isinstance(record.get("seq"), int):
        raise NotAnExportLine(f"{fmt} event without an audit record")
    if not isinstance(link, str):
        raise NotAnExportLine(f"{fmt} event without its link to the previous line")
    return fmt, record, obj, link


@dataclass(frozen=True, slots=True)
class FileVerifyResult:
    """``records`` verified before the first bad ``line`` (1-based). ``continues``: the
    file's first line links to a line before it (a resumed export's file); ``anchored``:
    the chains whose first record in the file is not their first (``key`` of that record).
    """

    ok: bool
    records: int
    line: int | None = None
    key: str | None = None
    reason: str | None = None
    continues: bool = False
    anchored: tuple[str, ...] = field(default=())


def verify_lines(lines: Iterable[str]) -> FileVerifyResult:
    """Check an exported file line by line (module docstring); stops at the first bad line."""
    tips: dict[str, tuple[int, str]] = {}
    anchored: list[str] = []
    good = 0
    previous: str | None = None  # the previous line's hash
    continues = False

    def bad(number: int, key: str | None, reason: str) -> FileVerifyResult:
        return FileVerifyResult(False, good, number, key, reason, continues, tuple(anchored))

    for number, line in enumerate(lines, start=1):
        try:
            fmt, record, envelope, link = parse_line(line)
            key = _key(record)
            expected = json.loads(format_line(fmt, record, link))
        except NotAnExportLine as exc:
            return bad(number, None, str(exc))
        except (KeyError, TypeError, ValueError) as exc:
            return bad(number, None, f"audit record without {exc}")
        if previous is None:
            continues = link != GENESIS
        elif link != previous:
            return bad(number, key, "the line before it is not the line exported before it")
        pk, seq = str(record["partition_key"]), record["seq"]
        if pk in tips:
            last_seq, last_hash = tips[pk]
            if seq != last_seq + 1:
                return bad(number, key, f"expected seq {last_seq + 1}, found {seq}")
            if record.get("prev_hash") != last_hash:
                return bad(number, key, "prev_hash is not the previous record's hash")
        elif seq == 1 and record.get("prev_hash") != GENESIS:
            return bad(number, key, "the first record of a chain does not start at genesis")
        elif seq != 1:
            anchored.append(key)
        if record.get("hash") != record_hash(record):
            return bad(number, key, "hash does not match the record's content")
        if envelope != expected:
            return bad(number, key, f"the {fmt} envelope does not match the record")
        tips[pk] = (seq, str(record["hash"]))
        previous = line_hash(line)
        good += 1
    return FileVerifyResult(True, good, continues=continues, anchored=tuple(anchored))


@dataclass(frozen=True, slots=True)
class Resume:
    """Where an export continues: per partition key the last ``seq`` written, and the
    ``line_hash`` of the last line written (the next line's ``link``)."""

    position: Mapping[str, int]
    link: str = GENESIS


def resume_of_lines(lines: Iterable[str]) -> Resume:
    """Where an exported file left off.

    Lines that do not parse (a line cut short by a crash) are passed over: the position
    only ever moves to records written whole.
    """
    position: dict[str, int] = {}
    link = GENESIS
    for line in lines:
        try:
            _, record, _, _ = parse_line(line)
        except NotAnExportLine:
            continue
        pk = str(record.get("partition_key"))
        position[pk] = max(position.get(pk, 0), record["seq"])
        link = line_hash(line)
    return Resume(position, link)


def since_position(records: Iterable[Mapping[str, Any]], since_ms: int) -> dict[str, int]:
    """A starting position that leaves out what occurred before ``since_ms``: per chain,
    the ``seq`` before its first record at or after it (its last ``seq`` if it has none)."""
    old: dict[str, int] = {}
    recent: dict[str, int] = {}
    for record in records:
        seq = record.get("seq")
        if not isinstance(seq, int):
            continue
        pk = str(record.get("partition_key"))
        if int(record.get("occurred_at", 0)) >= since_ms:
            recent[pk] = min(recent.get(pk, seq), seq)
        else:
            old[pk] = max(old.get(pk, seq), seq)
    return {pk: recent[pk] - 1 if pk in recent else old[pk] for pk in old.keys() | recent.keys()}


def select(records: Iterable[Mapping[str, Any]], position: Position) -> list[Mapping[str, Any]]:
    """The records to export after ``position``, each chain without a gap, oldest first."""
    chains: dict[str, dict[int, Mapping[str, Any]]] = {}
    for record in records:
        seq = record.get("seq")
        if isinstance(seq, int):
            chains.setdefault(str(record.get("partition_key")), {})[seq] = record
    chosen: list[Mapping[str, Any]] = []
    for pk, by_seq in chains.items():
        seq = position.get(pk, 0) + 1
        while seq in by_seq:
            chosen.append(by_seq[seq])
            seq += 1
    chosen.sort(key=lambda r: (int(r.get("occurred_at", 0)), str(r["partition_key"]), r["seq"]))
    return chosen


def advance(position: Position, written: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """``position`` moved past the ``written`` records."""
    moved = dict(position)
    for record in written:
        pk = str(record["partition_key"])
        moved[pk] = max(moved.get(pk, 0), int(record["seq"]))
    return moved
