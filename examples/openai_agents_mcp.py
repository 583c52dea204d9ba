"""An OpenAI Agents SDK agent whose tools go through ``callgate mcp`` (no model, no key).

The agent's model is ``ScriptedModel``: it returns the tool calls of a script, one per
turn, then a final message, so the example runs offline and the same way every time.
Everything else is real: the Agents SDK's ``MCPServerStdio`` starts ``callgate mcp`` as
a subprocess and lists its tools; callgate decides each call on the session the process
was started with (never on what the model writes).

    python examples/openai_agents_mcp.py [--state-dir DIR] [--profile FILE]

The script, on the shipped profile: read a ticket (executed); open a ticket naming
someone else as the requester (identity_spoof); refund an order (approval_required:
the human who owns the session confirms it with ``callgate approve``); then a second run
makes the same refund again, carrying the approval id and the idempotency key in the
request's ``_meta`` (executed, one refund). It prints one JSON object with the outcomes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agents import Agent, ModelSettings, RunContextWrapper, Runner, Usage
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.mcp import MCPServerStdio
from agents.mcp.util import MCPToolMetaContext
from agents.models.interface import Model, ModelTracing
from agents.tool import Tool
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
)


def callgate() -> str:
    beside = Path(sys.executable).parent / "callgate"
    found = str(beside) if beside.exists() else shutil.which("callgate")
    if found is None:
        raise SystemExit("the callgate command is not installed")
    return found


class ScriptedModel(Model):
    """Returns the scripted tool calls in order, then ``final``: a model without a model."""

    def __init__(self, calls: list[tuple[str, dict[str, Any]]], final: str) -> None:
        self.calls = list(calls)
        self.final = final
        self.turn = 0

    def _next(self) -> list[ResponseOutputItem]:
        self.turn += 1
        if self.calls:
            tool, args = self.calls.pop(0)
            return [
                ResponseFunctionToolCall(
                    type="function_call",
                    id=f"fc_{self.turn}",
                    call_id=f"call_{self.turn}",
                    name=tool,
                    arguments=json.dumps(args),
                )
            ]
        text = ResponseOutputText(type="output_text", text=self.final, annotations=[])
        return [
            ResponseOutputMessage(
                type="message",
                id=f"msg_{self.turn}",
                role="assistant",
                status="completed",
                content=[text],
            )
        ]

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        return ModelResponse(output=self._next(), usage=Usage(), response_id=None)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        response = Response.model_construct(
            id=f"resp_{self.turn + 1}",
            created_at=0,
            model="scripted",
            object="response",
            output=self._next(),
            parallel_tool_calls=False,
            tool_choice="auto",
            tools=[],
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )


def cli(state_dir: Path, profile: Path | None, *args: str) -> Any:
    argv = [callgate(), "--json", "--dev", "--state-dir", str(state_dir)]  # development tokens
    if profile is not None:
        argv += ["--profile", str(profile)]
    done = subprocess.run([*argv, *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def outcomes(result: Any) -> list[str]:
    """The callgate outcome of every tool call of a run, as the agent saw it.

    A refusal is a tool error whose text starts with its code (``identity_spoof: ...``);
    a result is the upstream's structured content.
    """
    found: list[str] = []
    for item in result.new_items:
        if item.type != "tool_call_output_item":
            continue
        out = item.output
        text = str(out.get("text", "")) if isinstance(out, dict) else str(out)
        code = re.match(r"^([a-z_]+): ", text)
        found.append(code.group(1) if code else "executed")
    return found


async def run(state_dir: Path, profile: Path | None) -> dict[str, Any]:
    alice = cli(
        state_dir,
        profile,
        "session",
        "issue",
        "--user",
        "alice",
        "--tenant",
        "acme",
        "--roles",
        "support",
    )["token"]
    refund = {"order_id": "ORD-42", "amount_cents": 5000, "currency": "EUR"}
    meta: dict[str, str] = {}  # what the agent platform adds to refunds.issue calls

    def resolve_meta(ctx: MCPToolMetaContext) -> dict[str, Any] | None:
        if ctx.tool_name != "refunds.issue":
            return None
        return {"callgate/idempotency_key": "refund-ORD-42", **meta}

    args = ["--dev", "--state-dir", str(state_dir)]
    if profile is not None:
        args += ["--profile", str(profile)]
    server = MCPServerStdio(
        params={"command": callgate(), "args": [*args, "mcp", "--session", alice]},
        name="callgate",
        client_session_timeout_seconds=60,
        use_structured_content=True,
        tool_meta_resolver=resolve_meta,
    )
    async with server:
        listed = sorted(t.name for t in await server.list_tools(RunContextWrapper(None), None))
        first = Agent(
            name="support agent",
            instructions="Help the customer.",
            model=ScriptedModel(
                [
                    ("tickets.read", {"ticket_id": "T-1"}),
                    ("tickets.create", {"title": "Refund", "requester_id": "mallory"}),
                    ("refunds.issue", refund),
                ],
                final="The refund waits for your confirmation.",
            ),
            mcp_servers=[server],
        )
        run1 = await Runner.run(first, "Refund order ORD-42, please.")

        # The human who owns the session confirms the dry-run, outside the conversation.
        pending = cli(state_dir, profile, "pending", "--session", alice)
        (waiting,) = [p for p in pending if p["tool"] == "refunds.issue"]
        approval = cli(state_dir, profile, "approve", waiting["invocation_id"], "--session", alice)
        meta["callgate/approval_id"] = approval["approval_id"]

        second = Agent(
            name="support agent",
            instructions="Help the customer.",
            model=ScriptedModel([("refunds.issue", refund)], final="Refunded."),
            mcp_servers=[server],
        )
        run2 = await Runner.run(second, "It is confirmed.")
    effects = [e for e in cli(state_dir, profile, "effects") if e.get("target") == "ORD-42"]
    return {
        "tools": listed,
        "first_run": outcomes(run1),
        "second_run": outcomes(run2),
        "final_output": run2.final_output,
        "refund_effects": len(effects),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument("--profile", type=Path, default=None)
    ns = parser.parse_args()
    state_dir = ns.state_dir or Path(tempfile.mkdtemp(prefix="callgate-agents-"))
    print(json.dumps(asyncio.run(run(state_dir, ns.profile)), indent=2))


if __name__ == "__main__":
    main()
