"""``make fuzz-campaign``: every atheris target to a number of inputs, from a kept corpus.

    python -m tests.fuzz.campaign [--runs 1000000] [--seconds 300] [--corpus .fuzz-corpus]
                                  [--findings .fuzz-findings] [TARGET ...]

Each target (``tests.fuzz.atheris_targets``) runs in a process of its own, one after the
other, until ``--runs`` inputs or ``--seconds`` of wall clock, whichever comes first. Its
corpus, ``<corpus>/<target>``, is kept between campaigns (libFuzzer adds the inputs that
reach new coverage); an empty one is seeded first. A finding (an exception other than the
target's refusal, or an inconsistency it checks for) stops that target and is written to
``<findings>/<target>/crash-…``, with the target's output in ``<findings>/<target>.log``.

One line per target: inputs executed, inputs per second, coverage (libFuzzer's ``cov``:
instrumented edges of callgate's code reached; ``ft``: features), corpus files, findings,
and whether the inputs reached ``--runs``. Exits 1 on any finding or a target that failed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODULE = "tests.fuzz.atheris_targets"
TARGETS = ("avro", "token", "args", "json", "mcp", "state", "form", "config", "profile")
_STATUS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)", re.MULTILINE)
_EXECUTED = re.compile(r"^stat::number_of_executed_units: (\d+)", re.MULTILINE)


@dataclass
class Figures:
    target: str
    inputs: int
    seconds: float
    cov: int
    ft: int
    corpus: int
    findings: list[Path]
    returncode: int
    runs: int

    def line(self) -> str:
        rate = self.inputs / self.seconds if self.seconds > 0 else 0.0
        reached = (
            "stopped" if self.findings else "reached" if self.inputs >= self.runs else "time cap"
        )
        return (
            f"{self.target:<8} inputs {self.inputs:>9,} ({reached}) {rate:>7,.0f}/s "
            f"{self.seconds:>5.0f} s  cov {self.cov:>4} ft {self.ft:>5}  "
            f"corpus {self.corpus:>5}  findings {len(self.findings)}"
        )

    def ok(self) -> bool:
        return not self.findings and self.returncode == 0


def parse(output: str) -> tuple[int, int, int]:
    """Inputs executed, ``cov`` and ``ft`` from libFuzzer's output (the last status line;
    the final statistics for the inputs, when printed)."""
    statuses = _STATUS.findall(output)
    inputs, cov, ft = (int(x) for x in statuses[-1]) if statuses else (0, 0, 0)
    executed = _EXECUTED.findall(output)
    return (int(executed[-1]) if executed else inputs), cov, ft


def seed(corpus: Path, target: str) -> None:
    """Write the target's seeds into its corpus directory when it has no input yet."""
    directory = corpus / target
    if directory.is_dir() and any(directory.iterdir()):
        return
    with tempfile.TemporaryDirectory(prefix="callgate-seeds-") as tmp:
        subprocess.run(
            [sys.executable, "-m", MODULE, "seeds", tmp], cwd=REPO, check=True, capture_output=True
        )
        directory.mkdir(parents=True, exist_ok=True)
        for path in (Path(tmp) / target).iterdir():
            (directory / path.name).write_bytes(path.read_bytes())


def run(target: str, runs: int, seconds: int, corpus: Path, findings: Path) -> Figures:
    seed(corpus, target)
    artifacts = findings / target
    artifacts.mkdir(parents=True, exist_ok=True)
    before = set(artifacts.iterdir())
    log = findings / f"{target}.log"
    command = [
        sys.executable,
        "-m",
        MODULE,
        target,
        f"-runs={runs}",
        f"-max_total_time={seconds}",
        "-print_final_stats=1",
        "-print_pcs=0",
        f"-artifact_prefix={artifacts}/",
        str(corpus / target),
    ]
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, check=False)
    elapsed = time.monotonic() - started
    output = log.read_text(errors="replace")
    inputs, cov, ft = parse(output)
    new = sorted(set(artifacts.iterdir()) - before)
    return Figures(
        target,
        inputs,
        elapsed,
        cov,
        ft,
        sum(1 for _ in (corpus / target).iterdir()),
        new,
        proc.returncode,
        runs,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=int, default=300, help="wall-clock cap per target")
    parser.add_argument("--corpus", type=Path, default=REPO / ".fuzz-corpus")
    parser.add_argument("--findings", type=Path, default=REPO / ".fuzz-findings")
    parser.add_argument("targets", nargs="*", metavar="TARGET", help=", ".join(TARGETS))
    ns = parser.parse_args(argv)
    unknown = sorted(set(ns.targets) - set(TARGETS))
    if unknown:
        parser.error(f"no such target: {', '.join(unknown)} (targets: {', '.join(TARGETS)})")
    print(f"== atheris campaign: up to {ns.runs:,} inputs or {ns.seconds} s per target")
    all_ok = True
    for target in ns.targets or TARGETS:
        figures = run(target, ns.runs, ns.seconds, ns.corpus, ns.findings)
        print(figures.line(), flush=True)
        for path in figures.findings:
            print(f"  finding: {path}  (the target's output: {ns.findings / target}.log)")
        if figures.returncode != 0 and not figures.findings:
            print(f"  failed with exit code {figures.returncode}: {ns.findings / target}.log")
        all_ok = all_ok and figures.ok()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
