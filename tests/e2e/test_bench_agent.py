"""``make bench-agent`` and ``make bench-guard`` in their smallest form: the agent's-path
bench still runs end to end (real upstreams, ``callgate mcp --http`` and ``callgate serve
--http``, the official SDK client) and prints its rows; the guard measures a real ratio and
its exit status follows the bound."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.mcp_support import REPO


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True, timeout=180
    )


def test_bench_agent_smallest_form_prints_every_row() -> None:
    done = run("tools.bench_agent", "--backend", "embedded", "--calls", "5", "--agents", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "agent (embedded): start of callgate mcp to the first answer" in out
    for path in ("MCP", "HTTP API"):
        cases = ["sequential, warm", "2 agents, warm"]
        if path == "MCP":
            cases += ["sequential, cold", "2 agents, cold"]
        for case in cases:
            for line in ("direct", "through callgate", "overhead"):
                assert f"agent (embedded) {path}, {case}: {line}" in out, (path, case, line)
    assert "p50 / p95 / p99 of 5 calls" in out
    assert out.count(": overhead") == 6


def test_bench_guard_passes_under_its_bound_and_fails_above_it() -> None:
    """The same smallest real run twice: under the shipped bound it passes (exit 0); with a
    bound below any possible ratio (the gated call cannot be 100 times faster than the
    direct one) it fails (exit 1), printing both medians and the ratio."""
    passed = run("tools.bench_guard", "--calls", "10")
    assert passed.returncode == 0, passed.stdout + passed.stderr
    ratio = re.search(r"ratio\s+(\d+\.\d\d)x\s+bound 20x\s+pass", passed.stdout)
    assert ratio and float(ratio[1]) > 0, passed.stdout
    assert "direct p50" in passed.stdout and "through callgate mcp p50" in passed.stdout
    failed = run("tools.bench_guard", "--calls", "10", "--bound", "0.01")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "bound 0.01x   FAIL" in failed.stdout
