"""The shorter conformance run of ``make test``: one official conformance scenario of each
feature ``callgate mcp`` relays (progress, logging, elicitation, sampling, reads, prompts,
``input_required`` rounds and a tampered ``requestState``), through callgate in front of
the SDK upstream fixture. ``make conformance`` runs every required scenario."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SUITE = REPO / "tests" / "conformance" / "node_modules" / "@modelcontextprotocol" / "conformance"


def test_the_quick_conformance_scenarios_pass_through_callgate() -> None:
    if shutil.which("npx") is None or not SUITE.is_dir():
        pytest.skip("the conformance suite is not installed (make installs it: npm ci)")
    done = subprocess.run(
        [sys.executable, "-P", str(REPO / "tests" / "conformance" / "run.py"), "--quick"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
    )  # fmt: skip
    print(done.stdout)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert done.stdout.count(": pass") == 10
