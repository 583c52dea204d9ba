"""``docs/contract.md`` is the contract inside the repository, and it is complete.

Every code of the vocabulary (``callgate.domain.codes.Code``: outcomes and command errors,
the only codes the command line prints) has its line in the document's vocabulary, and
the document names no code the program does not have. The README and the docs point to
files inside the repository only and name no developer's machine paths.
"""

from __future__ import annotations

import re
from pathlib import Path

from callgate.domain.codes import Code

REPO = Path(__file__).resolve().parents[2]
CONTRACT = REPO / "docs" / "contract.md"


def vocabulary_rows() -> set[str]:
    """The codes of the vocabulary tables: rows that start with a code in backticks."""
    text = CONTRACT.read_text()
    section = text.split("## Vocabulary", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M))


def test_every_code_has_a_line_in_the_contract_vocabulary() -> None:
    missing = {c.value for c in Code} - vocabulary_rows()
    assert not missing, f"codes missing from docs/contract.md's vocabulary: {sorted(missing)}"


def test_the_contract_names_no_code_the_program_does_not_have() -> None:
    stale = vocabulary_rows() - {c.value for c in Code}
    assert not stale, f"docs/contract.md lists codes the program lacks: {sorted(stale)}"


def test_the_contract_numbers_every_rule() -> None:
    text = CONTRACT.read_text()
    for rule in [f"C{n}" for n in range(1, 13)] + ["V1", "V2"]:
        assert re.search(rf"\*\*{rule}\b", text), rule


def test_readme_and_docs_point_inside_the_repository() -> None:
    """No contract outside the repository, no temporary directories of someone's machine."""
    outside = re.compile(r"\.\./shared|DESIGN\.md|/tmp/|/home/|/root/|/work/")
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found = [
        f"{page.relative_to(REPO)}:{n}: {line.strip()}"
        for page in pages
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if outside.search(line)
    ]
    assert not found, "\n".join(found)
