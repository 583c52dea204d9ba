"""A real upstream MCP server for the MCP gateway tests (the SDK's ``MCPServer``).

``python -P tests/mcp_upstream.py --ledger FILE [--http HOST:PORT]`` serves a small notes
tool set over stdio (default) or streamable HTTP. Every applied effect is one JSON line
in the ledger file, with the idempotency token callgate passed in ``_meta``; the notes'
state is folded from that file, so it survives restarts and the tests count effects there.

Definitions: ``FILE.descriptions.json`` changes tool descriptions while it runs.
Faults: ``FILE.faults.json`` holds a list of ``[tool, fault]`` pairs; the first call of
``tool`` takes the first matching one and removes it. ``timeout_after_apply`` applies the
effect, then sleeps longer than any test profile's ``timeout_s`` (the C12 case). ``fail``
answers with a tool error and applies nothing; ``jsonrpc_error`` with a JSON-RPC error
(``JSONRPC_FAULT_CODE``, with data), applying nothing.

The server deliberately does not deduplicate by token: "exactly one effect" must be
callgate's doing.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.exceptions import MCPError
from mcp.types import (
    EmptyResult,
    InputRequiredResult,
    SubscribeRequestParams,
    UnsubscribeRequestParams,
)
from pydantic import BaseModel

META_KEY = "callgate/idempotency_key"
META_INVOCATION = "callgate/invocation_id"
META_TENANT = "callgate/tenant"
JSONRPC_FAULT_CODE = -32042  # an application-defined JSON-RPC error code
JSONRPC_FAULT_DATA = {"reason": "quota", "retry_after_s": 30, "limits": ["daily", "ü"]}
SLOW_S = 8.0  # longer than any test profile's timeout_s


class Note(BaseModel):
    note_id: str
    text: str
    author: str | None = None


class Preview(BaseModel):
    note_id: str
    before: str | None
    after: str


class Found(BaseModel):
    found: bool
    result: dict[str, Any] | None = None


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.faults = path.with_name(path.name + ".faults.json")

    def effects(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line]

    def append(self, effect: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(json.dumps(effect, sort_keys=True) + "\n")

    def notes(self) -> dict[str, dict[str, Any]]:
        state: dict[str, dict[str, Any]] = {}
        for e in self.effects():
            if e["tool"] == "write_note":
                state[e["note_id"]] = {"note_id": e["note_id"], "text": e["text"]}
        return state

    def take_fault(self, tool: str) -> str | None:
        if not self.faults.exists():
            return None
        plan = json.loads(self.faults.read_text(encoding="utf-8"))
        for i, (name, fault) in enumerate(plan):
            if name == tool:
                del plan[i]
                self.faults.write_text(json.dumps(plan), encoding="utf-8")
                return str(fault)
        return None


def _heard(ledger: Ledger, tool: str, ctx: Context) -> None:
    """Log the ``Authorization`` header of the request (``FILE.headers.jsonl``): what a
    provider that obtains a token per call sent (ADR 0081)."""
    headers = ctx.headers or {}
    row = {"tool": tool, "authorization": headers.get("authorization")}
    with ledger.path.with_name(ledger.path.name + ".headers.jsonl").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(row, sort_keys=True) + "\n")


def _meta(ctx: Context) -> dict[str, Any]:
    meta = ctx.request_context.meta
    return dict(meta) if meta else {}


class _Upstream(MCPServer):
    """Lists its tools with the descriptions of ``FILE.descriptions.json`` when it exists
    (``{tool: description}``, read at each ``tools/list``): an upstream that changes a
    tool's definition while it runs (ADR 0066)."""

    def __init__(self, name: str, ledger: Ledger) -> None:
        super().__init__(name)
        self._changed = ledger.path.with_name(ledger.path.name + ".descriptions.json")

    async def list_tools(self) -> list[Any]:
        tools = await super().list_tools()
        if self._changed.exists():
            changed = json.loads(self._changed.read_text(encoding="utf-8"))
            for tool in tools:
                if tool.name in changed:
                    tool.description = changed[tool.name]
        return tools


def build(ledger: Ledger) -> MCPServer:
    server = _Upstream("notes-upstream", ledger)

    @server.tool()
    def read_note(note_id: str, ctx: Context) -> Note:
        """Read one note."""
        _heard(ledger, "read_note", ctx)
        note = ledger.notes().get(note_id)
        if note is None:
            raise ValueError(f"no note {note_id}")
        return Note(**note)

    @server.tool()
    def preview_note(note_id: str, text: str, ctx: Context, author: str | None = None) -> Preview:
        """What write_note would change (read-only)."""
        _heard(ledger, "preview_note", ctx)
        before = ledger.notes().get(note_id, {}).get("text")
        return Preview(note_id=note_id, before=before, after=text)

    async def _apply(tool: str, ctx: Context, effect: dict[str, Any]) -> dict[str, Any]:
        _heard(ledger, tool, ctx)
        fault = ledger.take_fault(tool)
        if fault == "fail":
            raise ValueError(f"{tool} failed (injected)")
        if fault == "jsonrpc_error":  # a protocol error: the upstream refuses, nothing applied
            raise MCPError(JSONRPC_FAULT_CODE, f"{tool} refused (injected)", JSONRPC_FAULT_DATA)
        meta = _meta(ctx)
        record = {
            "tool": tool,
            "token": meta.get(META_KEY),
            "invocation_id": meta.get(META_INVOCATION),
            "tenant": meta.get(META_TENANT),
            **effect,
        }
        ledger.append(record)
        if fault == "timeout_after_apply":
            await anyio.sleep(SLOW_S)
        return record

    @server.tool()
    async def write_note(note_id: str, text: str, ctx: Context, author: str | None = None) -> Note:
        """Create or replace a note."""
        await _apply("write_note", ctx, {"note_id": note_id, "text": text, "author": author})
        uri = f"notes://{note_id}"
        for session in list(watchers.get(uri, ())):  # the sessions subscribed to the note
            with contextlib.suppress(Exception):
                await session.send_resource_updated(uri)
        return Note(note_id=note_id, text=text, author=author)

    @server.tool()
    def find_note(idempotency_key: str, ctx: Context) -> Found:
        """Reconciliation: was a write applied with this idempotency key?"""
        _heard(ledger, "find_note", ctx)
        for e in ledger.effects():
            if e.get("token") == idempotency_key:
                note = {"note_id": e["note_id"], "text": e["text"], "author": e.get("author")}
                return Found(found=True, result=note)
        return Found(found=False)

    @server.tool()
    async def send_note(note_id: str, to: str, ctx: Context) -> dict[str, str]:
        """Send a note by e-mail (no preview, no lookup: the catalog decides what that means)."""
        await _apply("send_note", ctx, {"note_id": note_id, "to": to})
        return {"sent": note_id, "to": to}

    @server.tool()
    async def delete_note(note_id: str, ctx: Context) -> dict[str, str]:
        """Delete a note (this upstream offers no preview of it)."""
        await _apply("delete_note", ctx, {"note_id": note_id})
        return {"deleted": note_id}

    @server.tool()
    async def count_notes(prefix: str, ctx: Context) -> dict[str, int]:
        """Count the notes written under ``prefix``, reporting progress in three steps."""
        for step in (1, 2, 3):
            await ctx.report_progress(step, 3, f"counted part {step} of 3")
        return {
            "count": sum(
                1 for e in ledger.effects() if str(e.get("note_id", "")).startswith(prefix)
            )
        }

    @server.tool()
    async def sign_note(note_id: str, ctx: Context) -> InputRequiredResult | dict[str, str]:
        """Asks the client who signs ``note_id``, logs it, then signs it once (an effect).
        A 2026-07-28 client is asked with ``input_required``, an earlier one with an
        elicitation request during the call."""
        schema = {"type": "object", "properties": {"name": {"type": "string"}},
                  "required": ["name"]}  # fmt: skip
        if ctx.session.protocol_version >= "2026-07-28":
            answered = ctx.input_responses or {}
            if "signer" not in answered:
                question = {"method": "elicitation/create",
                            "params": {"message": f"Who signs {note_id}?",
                                       "requestedSchema": schema}}  # fmt: skip
                return InputRequiredResult.model_validate({"inputRequests": {"signer": question}})
            content = getattr(answered["signer"], "content", None) or {}
        else:
            elicited = await ctx.session.elicit_form(f"Who signs {note_id}?", schema)
            content = elicited.content or {}
        signer = str(content.get("name", ""))
        if not signer:
            raise ValueError("nobody signed")
        await ctx.info(f"{note_id} signed by {signer}")
        await _apply("sign_note", ctx, {"note_id": note_id, "signer": signer})
        return {"note_id": note_id, "signer": signer}

    @server.tool()
    async def purge_all(ctx: Context) -> dict[str, str]:
        """Not in callgate's catalog: no session may call it."""
        await _apply("purge_all", ctx, {})
        return {"purged": "all"}

    # Resources and prompts (ADR 0044): each read is one line in the ledger, so tests see
    # whether the upstream was reached at all.
    @server.resource("notes://{note_id}", mime_type="application/json")
    def note_resource(note_id: str) -> str:
        """One note as a resource."""
        ledger.append({"tool": "resources/read", "note_id": note_id})
        return json.dumps(ledger.notes().get(note_id) or {"note_id": note_id, "text": ""})

    @server.resource("notes://N-readme", mime_type="text/plain")
    def acme_readme() -> str:
        """acme's readme."""
        ledger.append({"tool": "resources/read", "note_id": "N-readme"})
        return "acme readme"

    @server.resource("notes://GN-readme", mime_type="text/plain")
    def globex_readme() -> str:
        """globex's readme."""
        ledger.append({"tool": "resources/read", "note_id": "GN-readme"})
        return "globex readme"

    @server.resource("secret://keys", mime_type="text/plain")
    def secret() -> str:
        """Not in callgate's catalog: no session may read it."""
        ledger.append({"tool": "resources/read", "note_id": "secret"})
        return "keys"

    @server.prompt()
    def summarize_note(note_id: str, style: str = "short") -> str:
        """Summarize one note."""
        ledger.append({"tool": "prompts/get", "note_id": note_id})
        return f"Summarize note {note_id} ({style})."

    @server.prompt()
    def leak_everything() -> str:
        """Not in callgate's catalog."""
        ledger.append({"tool": "prompts/get", "note_id": "leak"})
        return "leak"

    # Subscriptions (2025-11-25): a written note's URI is announced to its subscribers.
    watchers: dict[str, list[Any]] = {}

    async def subscribe(ctx: Any, params: SubscribeRequestParams) -> EmptyResult:
        ledger.append({"tool": "resources/subscribe", "uri": str(params.uri)})
        watchers.setdefault(str(params.uri), []).append(ctx.session)
        return EmptyResult()

    async def unsubscribe(ctx: Any, params: UnsubscribeRequestParams) -> EmptyResult:
        ledger.append({"tool": "resources/unsubscribe", "uri": str(params.uri)})
        watchers.pop(str(params.uri), None)
        return EmptyResult()

    low = server._lowlevel_server  # MCPServer leaves subscriptions out
    low.add_request_handler("resources/subscribe", SubscribeRequestParams, subscribe)
    low.add_request_handler("resources/unsubscribe", UnsubscribeRequestParams, unsubscribe)
    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ledger", type=Path, required=True)
    parser.add_argument("--http", default=None, help="HOST:PORT for streamable HTTP")
    ns = parser.parse_args()
    server = build(Ledger(ns.ledger))
    if ns.http:
        host, port = ns.http.rsplit(":", 1)
        server.run("streamable-http", host=host, port=int(port))
    else:
        server.run()


if __name__ == "__main__":
    main()
