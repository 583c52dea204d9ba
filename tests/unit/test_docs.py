"""The documentation holds together: every relative link in the README and under docs/
names a file that exists (and, for a ``#fragment`` into Markdown, a heading that does), and
no block of terminal output is wider than 100 columns; the README stays within 12 KB."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?\n(.*?)^```", re.S | re.M)
MAX_COLUMNS = 100


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case; letters, marks, digits, ``_``, spaces and
    dashes kept, the rest dropped; spaces to dashes."""
    kept = (c for c in heading.strip().lower() if c in " -" or _kept(unicodedata.category(c)))
    return "".join(kept).replace(" ", "-")


def _kept(category: str) -> bool:
    return category[0] in "LMN" or category == "Pc"


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m) for m in re.findall(r"^#+\s+(.*)$", text, flags=re.M)}


def test_relative_links_resolve() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            path, _, fragment = target.partition("#")
            found = (page.parent / path).resolve() if path else page
            if not found.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif fragment and found.suffix == ".md" and fragment not in anchors(found):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, broken


def test_no_terminal_block_is_wider_than_100_columns() -> None:
    wide = [
        f"{page.relative_to(REPO)}: {len(line)} columns: {line[:40]}"
        for page in PAGES
        for block in FENCE.findall(page.read_text())
        for line in block.splitlines()
        if len(line) > MAX_COLUMNS
    ]
    assert not wide, wide


def test_the_readme_is_short() -> None:
    assert len((REPO / "README.md").read_bytes()) <= 12 * 1024
