"""``make bench-compare BEFORE=<rev>``: the bench's figures of two revisions, in one run.

A refactor must not cost speed, and two bench runs minutes apart on a shared machine differ
by more than the change being judged. So the same bench sections run for the revision
before and for this checkout alternately, ABBA within each round (a drift of the machine's
load over the run then weighs on both alike), and each measure's median of each side is
compared: the change in percent, better or worse by the measure's direction, and whether it
is within ``--tolerance``.

``--before`` is a directory holding a checkout with its ``.venv`` or a git revision; a
revision is checked out into a worktree under ``~/.cache/callgate/bench-compare`` and its
environment installed with its own ``make .venv/.installed``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tools.cache import tool_cache

# Sections that compare well: each runs alone and prints figures of this process's code
# (``replay`` reads the log ``embedded`` wrote, so they run together). ``memory`` (a
# million keys, minutes a run) is left to ``--sections memory --rounds 1``.
SECTIONS = ("embedded,replay", "policy", "startup")
ROUNDS = 5  # three left a burst of the shared machine in the median
TOLERANCE_PCT = 5.0
_NUMBER = re.compile(r"-?[0-9][0-9,]*(?:\.[0-9]+)?")


@dataclass(frozen=True, slots=True)
class Figure:
    """One measure's first figure and whether more of it is better (a rate)."""

    value: float
    higher_is_better: bool


def figure(text: str) -> Figure | None:
    """The first number of a bench row's value and its direction: a rate (``/s``) is better
    higher; a time, a size or a ratio is better lower. None when the value holds no number
    (a failed section, a file path)."""
    found = _NUMBER.search(text)
    if found is None:
        return None
    rest = text[found.end() :].split("=")[0]
    return Figure(float(found.group().replace(",", "")), "/s" in rest)


def checkout(before: str, repo: Path) -> Path:
    """The directory of ``before``: itself when it is one, else a worktree of that revision
    with its environment installed."""
    path = Path(before)
    if path.is_dir():
        return path.resolve()
    rev = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", f"{before}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    where = tool_cache("bench-compare", "CALLGATE_BENCH_COMPARE_DIR") / rev[:12]
    if not (where / ".git").exists():
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "-f", "--detach", str(where), rev],
            check=True,
        )
    subprocess.run(["make", "-C", str(where), ".venv/.installed"], check=True)
    return where


def run_section(root: Path, section: str, quick: bool) -> dict[str, str]:
    """One bench run of ``section`` in ``root``'s checkout: measure → value."""
    command = [str(root / ".venv/bin/python"), "-m", "tools", "bench", "--json"]
    for name in section.split(","):
        command += ["--only", name]
    if quick:
        command.append("--quick")
    done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError as e:
        raise SystemExit(
            f"bench-compare: {root}: no JSON from the bench ({e}):\n{done.stderr}"
        ) from e
    if "rows" not in report:  # a section this revision lacks: nothing to compare
        print(f"bench-compare: {root}: {report.get('error')}", file=sys.stderr)
        return {}
    return {str(row["measure"]): str(row["value"]) for row in report["rows"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="a revision or a checkout directory")
    parser.add_argument("--after", default=".", help="a checkout directory (default: here)")
    parser.add_argument("--sections", default=" ".join(SECTIONS), help="space-separated")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE_PCT, help="percent")
    parser.add_argument("--quick", action="store_true", help="small counts (figures meaningless)")
    ns = parser.parse_args(argv)
    after = Path(ns.after).resolve()
    before = checkout(ns.before, after)
    sides = {"before": before, "after": after}
    seen: dict[str, dict[str, list[str]]] = {"before": {}, "after": {}}
    for section in ns.sections.split():
        for round_no in range(ns.rounds):
            order = ("before", "after") if round_no % 2 == 0 else ("after", "before")
            for side in order:
                print(f"bench-compare: {section}, round {round_no + 1}, {side}", file=sys.stderr)
                for measure, value in run_section(sides[side], section, ns.quick).items():
                    seen[side].setdefault(measure, []).append(value)
    print(f"bench-compare: {before} (before) against {after}, {ns.rounds} rounds, medians")
    print(f"{'measure':<60} {'before':>12} {'after':>12} {'change':>9}  within {ns.tolerance:g}%")
    rows = compared(seen["before"], seen["after"], ns.tolerance)
    for row in rows:
        if row.before is None or row.after is None:
            print(f"{row.measure[:60]:<60} {'-':>12} {'-':>12} {'-':>9}  (no figure on one side)")
            continue
        within = "yes" if row.within else "NO"
        print(
            f"{row.measure[:60]:<60} {row.before:>12,.1f} {row.after:>12,.1f}"
            f" {row.change_pct:>+8.1f}%  {within}"
        )
    worse = sum(not r.within for r in rows)
    if worse:
        print(f"bench-compare: {worse} measure(s) worse by more than {ns.tolerance:g}%")
    else:
        print(f"bench-compare: every measure within {ns.tolerance:g}% of before")
    return 1 if worse else 0


@dataclass(frozen=True, slots=True)
class Compared:
    """One measure's medians before and after; ``within``: not worse than the tolerance
    (a measure with no figure on one side is not judged)."""

    measure: str
    before: float | None
    after: float | None
    change_pct: float
    within: bool


def compared(
    before: dict[str, list[str]], after: dict[str, list[str]], tolerance_pct: float
) -> list[Compared]:
    """Each measure of ``after`` against ``before``: the medians of their figures, the change
    in percent, and whether it is worse (by the measure's direction) by more than
    ``tolerance_pct``."""
    rows: list[Compared] = []
    for measure, values in after.items():
        old = [f for v in before.get(measure, []) if (f := figure(v)) is not None]
        new = [f for v in values if (f := figure(v)) is not None]
        if not old or not new:
            rows.append(Compared(measure, None, None, 0.0, True))
            continue
        b = statistics.median(f.value for f in old)
        a = statistics.median(f.value for f in new)
        change = (a - b) / b * 100 if b else 0.0
        cost = -change if new[0].higher_is_better else change  # positive: worse
        rows.append(Compared(measure, b, a, change, cost <= tolerance_pct))
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
