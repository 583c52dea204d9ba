"""The pure part of the audit export (``callgate_projections.export``): formats, the check of
a file, and the choice of records that never skips one a reader has not seen yet."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from callgate.adapters.audit_export import Export, ExportMisuse, PositionStore
from callgate_projections.audit import GENESIS, audit_key, record_hash
from callgate_projections.export import (
    FORMATS,
    advance,
    format_line,
    line_hash,
    parse_line,
    select,
    since_position,
    verify_lines,
)


def chain(pk: str, count: int, start_ms: int = 1_000) -> list[dict[str, Any]]:
    """``count`` chained audit records of partition key ``pk``, one second apart."""
    records, prev = [], GENESIS
    for seq in range(1, count + 1):
        record: dict[str, Any] = {
            "invocation_id": f"{pk}-inv-{seq}",
            "partition_key": pk,
            "proposed_by": "model",
            "authorized_by": {"principal": {"user": "u", "tenant": "t", "roles": ["r"]}},
            "tool": "tickets.read",
            "outcome": "executed",
            "revision": 1,
            "occurred_at": start_ms + seq * 1000,
            "seq": seq,
            "prev_hash": prev,
        }
        record["hash"] = prev = record_hash(record)
        records.append(record)
    return records


def export_lines(fmt: str, records: list[dict[str, Any]], link: str = GENESIS) -> list[str]:
    out = []
    for record in records:
        line = format_line(fmt, record, link)
        out.append(line)
        link = line_hash(line)
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_line_carries_the_record_and_parses_back(fmt: str) -> None:
    [record] = chain("k-a", 1)
    line = format_line(fmt, record)
    parsed_fmt, parsed, _, link = parse_line(line)
    assert (parsed_fmt, parsed, link) == (fmt, record, GENESIS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_untouched_file_verifies_and_each_kind_of_edit_names_its_line(fmt: str) -> None:
    lines = export_lines(fmt, chain("k-a", 3) + chain("k-b", 2))
    assert verify_lines(lines).ok and verify_lines(lines).records == 5
    swapped = [lines[0], lines[2], lines[1], *lines[3:]]
    result = verify_lines(swapped)
    assert (result.ok, result.line) == (False, 2)
    edited = json.loads(lines[3])
    target = edited["data"] if fmt == "cloudevents" else edited["unmapped"]["callgate_audit"]
    target["tool"] = "users.delete"
    result = verify_lines([*lines[:3], json.dumps(edited), lines[4]])
    assert (result.ok, result.line, result.reason) == (
        False,
        4,
        "hash does not match the record's content",
    )


def test_a_resumed_exporters_file_is_flagged_as_continuing() -> None:
    records = chain("k-a", 4)
    first = export_lines("cloudevents", records[:2])
    rest = export_lines("cloudevents", records[2:], line_hash(first[-1]))
    assert verify_lines(first + rest).ok
    alone = verify_lines(rest)
    assert alone.ok and alone.continues and alone.anchored == (audit_key("k-a", 3),)


def test_select_waits_for_a_record_not_seen_yet_instead_of_skipping_it() -> None:
    """A view read while one partition lags may hold seq 3 but not seq 2: 3 waits."""
    a = chain("k-a", 3)
    assert select([a[0], a[2]], {}) == [a[0]]
    assert select(a, {"k-a": 1}) == [a[1], a[2]]
    assert advance({"k-a": 1}, a[1:]) == {"k-a": 3}


def test_since_starts_each_chain_at_its_first_recent_record() -> None:
    a, b = chain("k-a", 3, start_ms=0), chain("k-b", 2, start_ms=10_000)
    assert since_position(a + b, since_ms=2_500) == {"k-a": 2, "k-b": 0}
    assert since_position(a, since_ms=60_000) == {"k-a": 3}


def test_a_named_exporter_resumes_and_a_crash_between_write_and_store_repeats_nothing(
    tmp_path: Path,
) -> None:
    records = chain("k-a", 2) + chain("k-b", 1)
    store, out = PositionStore(tmp_path / "state"), tmp_path / "out.jsonl"

    def run(visible: list[dict[str, Any]], **kw: Any) -> int:
        job = Export(
            "cloudevents", lambda: visible, io.StringIO(), out, name="x", store=store, **kw
        )
        return job.run()

    assert run(records[:2]) == 2
    behind = store.load("x")
    assert run(records) == 1
    assert behind is not None
    store.save("x", behind)  # the last run "crashed" after writing, before storing
    with out.open("a") as f:
        f.write('{"specversion": "1.0", "id": "cut sh')  # and left half a line
    assert run(records) == 0
    assert verify_lines(out.read_text().splitlines()).records == 3
    with pytest.raises(ExportMisuse, match="--since"):
        run(records, since_ms=0)
    with pytest.raises(ExportMisuse, match="exporter name"):
        store.path("../etc")
