"""``callgate mcp`` on the Kafka backend: the MCP surface publishes proposals to the topics
and reads outcomes from the views, like any other client; ``callgate serve`` (on the
suite's Apache Kafka broker) runs the deciders, and its executor child calls the upstream MCP
server (``tests/mcp_upstream.py``) it starts from the profile.

One deployment and one MCP session run the scenarios in order (a Kafka deployment takes
seconds to join its groups): policy-filtered ``tools/list``, a read, V1, V2, an upstream's
JSON-RPC error (the agent's, as it is) and an upstream that times out after applying its
effect.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import mcp
import mcp_types as types
import pytest

from tests.e2e.helpers import CALLGATE, cli_env
from tests.harness import without_continuation
from tests.kafka_support import Deployment, DeploymentSpec
from tests.mcp_support import effects, inject, write_profile
from tests.mcp_upstream import JSONRPC_FAULT_CODE, JSONRPC_FAULT_DATA

pytestmark = [pytest.mark.kafka, pytest.mark.e2e, pytest.mark.anyio]


def notes_profile(root: Path) -> Path:
    """The notes tools, writing to ``root/notes.jsonl`` (``LEDGER``)."""
    # The executor's upstream call gets 4 s here: a transaction commit under load can
    # take a second, and only the injected fault may time out.
    profile = write_profile(root / "profile", root / LEDGER, timeout_s=4.0, with_defaults=True)
    without_continuation(profile)  # the platform resubmits with the approval id here
    return profile


LEDGER = "notes.jsonl"
KAFKA_DEPLOYMENT = DeploymentSpec("mcp", profile=notes_profile)


def _meta(key: str, approval_id: str | None = None) -> types.RequestParamsMeta:
    m: dict[str, Any] = {"callgate/idempotency_key": key}
    if approval_id is not None:
        m["callgate/approval_id"] = approval_id
    return cast(types.RequestParamsMeta, m)


def _outcome(r: types.CallToolResult) -> str:
    assert isinstance(r.structured_content, dict), r
    if not r.is_error:
        assert r.meta is not None
        return str(r.meta["callgate/outcome"])
    return str(r.structured_content["outcome"])


async def test_mcp_surface_on_kafka(kafka_deployment: Deployment) -> None:
    dep, ledger = kafka_deployment, kafka_deployment.state_dir.parent / LEDGER
    gate = dep.connect()
    try:
        issue = gate.app.session_issuer.issue
        alice = issue("alice", "acme", ["support"], gate.app.clock())
        approver = issue("bob", "acme", ["notes-approver"], gate.app.clock())
        params = mcp.StdioServerParameters(
            command=str(CALLGATE),
            args=["mcp", "--session", alice, "--timeout", "60"],
            env={**cli_env(), **dep.env()},
        )
        async with mcp.Client(params, cache=None) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            assert {"notes.read", "notes.write", "refunds.issue"} <= names
            assert not {"notes.audit", "deploys.trigger", "purge_all"} & names

            note = {"note_id": "N-1", "text": "on kafka", "author": "alice"}
            wrote = await c.call_tool("notes.quick_write", note, meta=_meta("kq-1"))
            assert _outcome(wrote) == "executed", wrote
            read = await c.call_tool("notes.read", {"note_id": "N-1"})
            assert _outcome(read) == "executed" and read.structured_content == {
                **note,
                "author": None,
            }

            spoof = await c.call_tool("notes.quick_write", {**note, "author": "mallory"})
            assert _outcome(spoof) == "identity_spoof", spoof

            v2 = {"note_id": "N-2", "text": "approved", "author": "alice"}
            first = await c.call_tool("notes.write", v2, meta=_meta("kv2"))
            assert _outcome(first) == "approval_required", first
            assert isinstance(first.structured_content, dict)
            invocation_id = first.structured_content["invocation_id"]
            approval_id = gate.approve(invocation_id, approver)["approval_id"]
            swapped = await c.call_tool(
                "notes.write", {**v2, "text": "swapped"}, meta=_meta("kv2", approval_id)
            )
            assert _outcome(swapped) == "approval_mismatch", swapped
            done = await c.call_tool("notes.write", v2, meta=_meta("kv2", approval_id))
            assert _outcome(done) == "executed", done
            again = await c.call_tool("notes.write", v2, meta=_meta("kv2"))
            assert _outcome(again) == "replayed", again

            inject(ledger, "write_note", "jsonrpc_error")  # refused upstream: nothing ran
            refused_note = {"note_id": "N-9", "text": "refused", "author": "alice"}
            with pytest.raises(mcp.MCPError) as refused:
                await c.call_tool("notes.quick_write", refused_note, meta=_meta("kerr"))
            assert (refused.value.code, refused.value.message, refused.value.data) == (
                JSONRPC_FAULT_CODE,
                "write_note refused (injected)",
                JSONRPC_FAULT_DATA,
            )

            inject(ledger, "write_note", "timeout_after_apply")
            slow = {"note_id": "N-3", "text": "slow", "author": "alice"}
            uncertain = await c.call_tool("notes.quick_write", slow, meta=_meta("kslow"))
            assert _outcome(uncertain) == "outcome_uncertain", uncertain
            retry = await c.call_tool("notes.quick_write", slow, meta=_meta("kslow"))
            # the original was found by find_note; the retry is served its result
            assert _outcome(retry) in {"executed", "replayed"}, retry
            assert retry.structured_content == slow
    finally:
        gate.close()
    writes = effects(ledger, "write_note")
    assert [w["note_id"] for w in writes] == ["N-1", "N-2", "N-3"], writes
