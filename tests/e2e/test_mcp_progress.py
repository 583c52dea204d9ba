"""The upstream's progress during a call reaches the agent (issue 28 part 2, progress;
ADR 0075), with the official SDK client over stdio to embedded ``callgate mcp``.

The agent gives a ``progressToken``; the upstream reports three steps while callgate's
executor runs the call in the ``callgate mcp`` process; the agent receives each, in
order, under its own token, then the result. Without a token nothing is relayed and the
call answers the same.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.test_mcp_gateway import ALICE_ROLES
from tests.mcp_support import Gate, MakeMcpGate

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]
COUNT = {
    "description": "Count notes, with progress.",
    "provider": "notes",
    "upstream_tool": "count_notes",
    "mutation": False,
    "impact": "low",
    "require_dry_run": False,
    "confirmation": "none",
    "target_arg": "prefix",
    "callers": ["support"],
    "args_schema": {
        "type": "object",
        "required": ["prefix"],
        "properties": {"prefix": {"type": "string", "minLength": 1, "maxLength": 64}},
        "additionalProperties": False,
    },
}


def add_count(doc: dict[str, Any]) -> None:
    doc["tools"]["notes.count"] = COUNT


@pytest.fixture
def counting_mcp_gate(make_mcp_gate: MakeMcpGate) -> Gate:
    """The notes profile with ``notes.count`` (an upstream tool that reports progress), over
    stdio."""
    return make_mcp_gate("stdio", add_count)


async def test_the_upstreams_progress_reaches_the_agent_under_its_token(
    counting_mcp_gate: Gate,
) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with counting_mcp_gate.client(counting_mcp_gate.token("alice", ALICE_ROLES)) as c:
        result = await c.call_tool("notes.count", {"prefix": "N-"}, progress_callback=progress)
        assert not result.is_error, result
        assert result.structured_content == {"count": 0}
        assert seen == [(float(n), 3.0, f"counted part {n} of 3") for n in (1, 2, 3)]

        seen.clear()
        again = await c.call_tool("notes.count", {"prefix": "N-"})  # no token: no relay
        assert not again.is_error and again.structured_content == {"count": 0}
        assert seen == []
