"""The OpenAI Agents SDK example (``examples/openai_agents_mcp.py``) runs as documented.

A scripted model drives a real Agents SDK agent whose MCP server is the installed
``callgate mcp`` (stdio); no network, no API key. The example's own JSON report says what
the agent saw: a read executed, a spoofed requester refused, a refund that waited for the
owner's confirmation and then ran exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import REPO, cli_env

pytestmark = [pytest.mark.e2e]
EXAMPLE = REPO / "examples" / "openai_agents_mcp.py"


def test_agents_sdk_example_runs_offline(tmp_path: Path) -> None:
    env = {k: v for k, v in cli_env().items() if not k.startswith("OPENAI_")}
    env["OPENAI_AGENTS_DISABLE_TRACING"] = "1"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--state-dir", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["tools"] == ["records.update", "refunds.issue", "tickets.create", "tickets.read"]
    assert report["first_run"] == ["executed", "identity_spoof", "approval_required"]
    assert report["second_run"] == ["executed"]
    assert report["final_output"] == "Refunded."
    assert report["refund_effects"] == 1
