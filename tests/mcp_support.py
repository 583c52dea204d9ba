"""Shared helpers of the MCP gateway tests: the profile in front of ``tests/mcp_upstream.py``.

``write_profile`` writes an adoption profile whose ``notes`` provider is the test upstream
(over stdio, or over streamable HTTP at a URL) with its effect ledger at ``ledger``:

| tool | upstream | kind | dry-run | lookup | confirmation | callers |
|---|---|---|---|---|---|---|
| notes.read | read_note | read | - | - | none | support, auditor |
| notes.write | write_note | mutation, high impact | preview_note | find_note | approver | support |
| notes.quick_write | write_note | mutation | - | find_note | none | support |
| notes.send | send_note | mutation | - | - | none | support |
| notes.delete | delete_note | mutation (strict defaults) | none declared | - | approver | support |
| notes.audit | read_note | read | - | - | none | auditor |
| notes.resource | resources/read notes://* | read | - | - | none | support |
| notes.summarize | prompts/get summarize_note | read | - | - | none | support |

``purge_all`` is an upstream tool with no catalog entry. Notes ``N-*`` belong to tenant
acme, ``GN-*`` to globex. ``notes.write`` names the author as an identity argument.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mcp
import yaml
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from tools.ports import free_port, wait_port

from callgate.bootstrap import Settings
from tests.dev_sessions import dev_token
from tests.e2e.helpers import CALLGATE, cg, cli_env

REPO = Path(__file__).resolve().parents[1]
UPSTREAM = REPO / "tests" / "mcp_upstream.py"
DEFAULT_PROFILE = REPO / "services" / "callgate" / "profiles" / "default.yaml"
DEFAULT_CEDAR = DEFAULT_PROFILE.parent / "default.cedar"

NOTE_SCHEMA = {
    "type": "object",
    "required": ["note_id", "text"],
    "properties": {
        "note_id": {"type": "string", "minLength": 1, "maxLength": 64},
        "text": {"type": "string", "maxLength": 2000},
        "author": {"type": "string", "minLength": 1, "maxLength": 128},
    },
    "additionalProperties": False,
}
READ_SCHEMA = {
    "type": "object",
    "required": ["note_id"],
    "properties": {"note_id": {"type": "string", "minLength": 1, "maxLength": 64}},
    "additionalProperties": False,
}
SEND_SCHEMA = {
    "type": "object",
    "required": ["note_id", "to"],
    "properties": {"note_id": {"type": "string"}, "to": {"type": "string"}},
    "additionalProperties": False,
}

URI_SCHEMA = {
    "type": "object",
    "required": ["uri"],
    "properties": {"uri": {"type": "string", "maxLength": 512}},
    "additionalProperties": False,
}
PROMPT_SCHEMA = {
    "type": "object",
    "required": ["note_id"],
    "properties": {
        "note_id": {"type": "string", "minLength": 1, "maxLength": 64},
        "style": {"type": "string", "enum": ["short", "long"]},
    },
    "additionalProperties": False,
}

_READ = {
    "mutation": False,
    "impact": "low",
    "require_dry_run": False,
    "confirmation": "none",
}


def upstream_command(ledger: Path) -> list[str]:
    """The upstream as a script; ``-P`` keeps ``tests/`` off ``sys.path`` (``tests/http``
    would shadow the standard library's ``http``)."""
    return [sys.executable, "-P", str(UPSTREAM), "--ledger", str(ledger)]


def tools() -> dict[str, Any]:
    return {
        "notes.read": {
            **_READ,
            "description": "Read one note.",
            "provider": "notes",
            "upstream_tool": "read_note",
            "target_arg": "note_id",
            "callers": ["support", "auditor"],
            "args_schema": READ_SCHEMA,
        },
        "notes.write": {
            "description": "Write a note; an approver confirms the preview.",
            "provider": "notes",
            "upstream_tool": "write_note",
            "dry_run_tool": "preview_note",
            "lookup_tool": "find_note",
            "mutation": True,
            "impact": "high",
            "require_dry_run": True,
            "confirmation": "approver",
            "target_arg": "note_id",
            "identity_args": ["author"],
            "callers": ["support"],
            "approvers": ["notes-approver"],
            "args_schema": NOTE_SCHEMA,
        },
        "notes.quick_write": {
            "description": "Write a note without confirmation.",
            "provider": "notes",
            "upstream_tool": "write_note",
            "lookup_tool": "find_note",
            "mutation": True,
            "impact": "low",
            "require_dry_run": False,
            "confirmation": "none",
            "target_arg": "note_id",
            "identity_args": ["author"],
            "callers": ["support"],
            "args_schema": NOTE_SCHEMA,
        },
        "notes.send": {
            "description": "Send a note by e-mail (no lookup: uncertain stays uncertain).",
            "provider": "notes",
            "upstream_tool": "send_note",
            "mutation": True,
            "impact": "low",
            "require_dry_run": False,
            "confirmation": "none",
            "target_arg": "note_id",
            "callers": ["support"],
            "args_schema": SEND_SCHEMA,
        },
        "notes.delete": {
            "description": "Delete a note (strict defaults; the upstream has no preview).",
            "provider": "notes",
            "upstream_tool": "delete_note",
            "target_arg": "note_id",
            "callers": ["support"],
            "approvers": ["notes-approver"],
            "args_schema": READ_SCHEMA,
        },
        "notes.audit": {
            **_READ,
            "description": "Auditors read notes.",
            "provider": "notes",
            "upstream_tool": "read_note",
            "target_arg": "note_id",
            "callers": ["auditor"],
            "args_schema": READ_SCHEMA,
        },
        "notes.resource": {
            **_READ,
            "description": "Notes as resources (notes://<note id>).",
            "provider": "notes",
            "upstream_method": "resources/read",
            "uris": ["notes://*"],
            "target_arg": "uri",
            "callers": ["support"],
            "args_schema": URI_SCHEMA,
        },
        "notes.summarize": {
            **_READ,
            "description": "The upstream's summarize_note prompt.",
            "provider": "notes",
            "upstream_method": "prompts/get",
            "upstream_tool": "summarize_note",
            "target_arg": "note_id",
            "callers": ["support"],
            "args_schema": PROMPT_SCHEMA,
        },
    }


def write_profile(
    folder: Path,
    ledger: Path,
    url: str | None = None,
    timeout_s: float = 3.0,
    with_defaults: bool = False,
) -> Path:
    """The profile above; ``with_defaults`` adds the shipped profile's tools and resources
    (the Kafka readiness probe proposes ``refunds.issue``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "policy.cedar").write_text(DEFAULT_CEDAR.read_text())
    notes: dict[str, Any] = {"kind": "mcp", "timeout_s": timeout_s}
    if url is None:
        notes["command"] = upstream_command(ledger)
    else:
        notes["url"] = url
    doc: dict[str, Any] = {
        "version": 1,
        "policy_file": "policy.cedar",
        "resources": {"acme": ["N-*", "notes://N-*"], "globex": ["GN-*", "notes://GN-*"]},
        "providers": {"notes": notes},
        "tools": tools(),
    }
    if with_defaults:
        shipped = yaml.safe_load(DEFAULT_PROFILE.read_text())
        doc["tools"] = {**shipped["tools"], **doc["tools"]}
        doc["providers"] = {**shipped["providers"], **doc["providers"]}
        doc["resources"] = {
            t: [*shipped["resources"].get(t, []), *globs] for t, globs in doc["resources"].items()
        }
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def effects(ledger: Path, tool: str | None = None) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    rows = [json.loads(line) for line in ledger.read_text().splitlines() if line]
    return [r for r in rows if tool is None or r["tool"] == tool]


def inject(ledger: Path, tool: str, fault: str) -> None:
    """The upstream's next call of ``tool`` takes ``fault`` (see tests/mcp_upstream.py)."""
    path = ledger.with_name(ledger.name + ".faults.json")
    plan = json.loads(path.read_text()) if path.exists() else []
    plan.append([tool, fault])
    path.write_text(json.dumps(plan))


def redescribe(ledger: Path, tool: str, description: str | None) -> None:
    """The upstream lists ``tool`` (its own name) with ``description`` from its next
    ``tools/list`` on (``None``: as built) (see tests/mcp_upstream.py)."""
    path = ledger.with_name(ledger.name + ".descriptions.json")
    changed = json.loads(path.read_text()) if path.exists() else {}
    if description is None:
        changed.pop(tool, None)
    else:
        changed[tool] = description
    path.write_text(json.dumps(changed))


@contextlib.contextmanager
def http_upstream(ledger: Path, log: Path) -> Iterator[str]:
    """The test upstream over streamable HTTP on a free loopback port; its URL."""
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*upstream_command(ledger), "--http", f"127.0.0.1:{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_port(port, proc, log, 30)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.terminate()
            proc.wait(timeout=20)


def heard(ledger: Path) -> list[dict[str, Any]]:
    """What the upstream logged of each tool call: its ``Authorization`` header."""
    path = ledger.with_name(ledger.name + ".headers.jsonl")
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


CONSOLE = "http://console.example/cg"


@dataclass
class Gate:
    """One callgate deployment: state dir, profile, upstream ledger, a way to connect."""

    state_dir: Path
    profile: Path
    ledger: Path
    transport: str
    url: str | None = None

    def token(self, user: str, roles: list[str], tenant: str = "acme") -> str:
        settings = Settings(state_dir=self.state_dir, profile=self.profile, dev=True)
        return dev_token(settings, user, tenant, roles)

    @contextlib.asynccontextmanager
    async def client(self, token: str, **kw: Any) -> AsyncIterator[mcp.Client]:
        if self.transport == "stdio":
            params = mcp.StdioServerParameters(
                command=str(CALLGATE),
                args=[
                    "--state-dir",
                    str(self.state_dir),
                    "--profile",
                    str(self.profile),
                    "mcp",
                    "--session",
                    token,
                    "--console-url",
                    CONSOLE,
                ],
                env={**cli_env(), "CALLGATE_DEV": "1"},  # development tokens
            )
            async with mcp.Client(params, cache=None, **kw) as client:
                yield client
        else:
            assert self.url is not None
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
            async with (
                http,
                mcp.Client(
                    streamable_http_client(self.url, http_client=http), cache=None, **kw
                ) as client,
            ):
                yield client

    def approve(self, invocation_id: str) -> str:
        approver = self.token("bob", ["notes-approver"])
        answer = cg(self.state_dir, "approve", invocation_id, "--session", approver)
        return str(answer["approval_id"])


# ``make_mcp_gate(transport, edit=None, quiet=True)`` (tests/e2e/conftest.py).
MakeMcpGate = Callable[..., Gate]


@contextlib.contextmanager
def running_gate(
    folder: Path,
    transport: str,
    edit: Callable[[dict[str, Any]], None] | None = None,
    quiet: bool = True,
) -> Iterator[Gate]:
    """A gate in ``folder``: a fresh state directory and the notes profile (``edit``: changes
    to its document, e.g. a tool added), its notes in ``folder/notes.jsonl``. Over ``http``
    one ``callgate mcp --http`` runs for the block, then stops; its log must hold no
    traceback and, when ``quiet``, no warning (the start-up check: the catalog fits the
    upstream). Over ``stdio`` each client starts its own ``callgate mcp``."""
    ledger = folder / "notes.jsonl"
    profile = write_profile(folder / "profile", ledger)
    if edit is not None:
        doc = yaml.safe_load(profile.read_text())
        edit(doc)
        profile.write_text(yaml.safe_dump(doc, sort_keys=False))
    gate = Gate(folder / "state", profile, ledger, transport)
    gate.state_dir.mkdir()
    if transport == "stdio":
        yield gate
        return
    port = free_port()
    logged = folder / "mcp-http.log"
    with logged.open("w") as log:
        proc = subprocess.Popen(
            [
                *(str(CALLGATE), "--state-dir", str(gate.state_dir), "--profile"),
                *(str(gate.profile), "mcp", "--http", f"127.0.0.1:{port}"),
                *("--console-url", CONSOLE),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**cli_env(), "CALLGATE_DEV": "1"},  # development tokens
        )
        gate.url = f"http://127.0.0.1:{port}/mcp"
        try:
            wait_port(port, proc, logged, 30)
            yield gate
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    assert "Traceback" not in logged.read_text()
    if quiet:
        assert "warning" not in logged.read_text()
