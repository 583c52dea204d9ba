"""``make bench-agent`` in its smallest form: the agent's-path bench still runs end to end
(a real upstream, ``callgate mcp --http``, the official SDK client) and prints its rows."""

from __future__ import annotations

import subprocess
import sys

from tests.mcp_support import REPO


def test_bench_agent_smallest_form_prints_every_row() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench_agent", "--backend", "embedded", "--calls", "5",
         "--agents", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cold: start of callgate mcp to the first call's answer" in done.stdout
    assert "sequential (5 + 5 calls)" in done.stdout
    assert "2 concurrent agents" in done.stdout
    assert done.stdout.count("overhead") == 2
