"""Decision records carry a status and an index lists them all (docs/adr/README.md).

Every record has a ``## Status`` section whose first sentence is its status, in one form:
``Accepted``, ``Accepted; amended by N[, N and N]``, ``Partly superseded by N[...]``,
``Superseded by N[...]`` or ``Proposed``; every N is a record that exists and is later
than the one it changes. The index has one row per record whose status is that sentence.
"""

from __future__ import annotations

import re
from pathlib import Path

ADRS = Path(__file__).resolve().parents[2] / "docs" / "adr"
INDEX = ADRS / "README.md"
NUMBERS = r"\d{4}(?:(?:, | and )\d{4})*"
STATUS = re.compile(
    rf"(?:Accepted(?:; amended by {NUMBERS})?|(?:Partly s|S)uperseded by {NUMBERS}|Proposed)"
)
ROW = re.compile(r"^\| \[(\d{4})\]\(([^)]+)\) \| (.+?) \| (.+?) \|$", re.M)


def records() -> list[Path]:
    return sorted(ADRS.glob("[0-9][0-9][0-9][0-9]-*.md"))


def status_of(text: str) -> str | None:
    """The first sentence of the ``## Status`` section right after the title, or None."""
    m = re.match(r"# [^\n]+\n\n## Status\n(.+?)(?:\n\n|$)", text, flags=re.S)
    if m is None:
        return None
    paragraph = " ".join(m.group(1).split())
    return paragraph.split(". ")[0].removesuffix(".")


def test_every_record_has_a_status_in_one_form() -> None:
    assert len(records()) > 40
    wrong = {}
    for record in records():
        status = status_of(record.read_text())
        if status is None or not STATUS.fullmatch(status):
            wrong[record.name] = status
    assert not wrong, wrong


def test_a_record_is_changed_only_by_a_later_record_that_exists() -> None:
    numbers = {r.name[:4] for r in records()}
    for record in records():
        status = status_of(record.read_text()) or ""
        for later in re.findall(r"\d{4}", status):
            assert later in numbers, (record.name, later)
            assert later > record.name[:4], (record.name, later)


def test_the_index_lists_every_record_with_its_status() -> None:
    rows = {m.group(2): (m.group(1), m.group(4)) for m in ROW.finditer(INDEX.read_text())}
    expected = {r.name: (r.name[:4], status_of(r.read_text())) for r in records()}
    assert rows == expected


def test_the_status_check_refuses_what_it_should() -> None:
    assert status_of("# 0001 T\n\n## Context\nx\n") is None
    assert status_of("# 0001 T\n\n## Status\nAccepted; amended by 0028\nand 0077. More.\n")
    assert STATUS.fullmatch("Accepted; amended by 0028 and 0077")
    assert STATUS.fullmatch("Partly superseded by 0024 and 0062")
    assert not STATUS.fullmatch("accepted")
    assert not STATUS.fullmatch("Accepted, mostly")
    assert not STATUS.fullmatch("Superseded")
