"""The full-disk campaign's deployment (``tools.disk_full``): ``callgate serve --http`` on
the state directory, and one call through each surface a caller has (the command line,
the HTTP API, ``callgate mcp`` over stdio), with the code each answered; and the files of
the state directory besides the store, written while the disk is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from callgate.adapters.audit_export import PositionStore
from callgate.adapters.keyfiles import generate_key_pair
from callgate.bootstrap import App
from callgate.domain.codes import storage_failure
from callgate_projections.export import Resume
from tools.chaos import EXECUTED, Call

SERVE_STOP_S = 15.0  # serve's grace period is 10 s
PROBE_TIMEOUT_S = 60.0
ANSWER_S = "5"  # a probe's wait for a decision (a call recorded during a fault waits for it)
PROBE_TOOL, PROBE_ARGS = "tickets.read", {"ticket_id": "T-probe"}
SURFACES = ("cli", "http", "mcp")
META_OUTCOME, META_INVOCATION = "callgate/outcome", "callgate/invocation_id"  # callgate mcp's


@dataclass(frozen=True)
class Answer:
    """What one surface answered a probe: its code, the invocation it names, whether it
    printed a traceback, and the fault it was asked during (``None``: none)."""

    surface: str
    code: str
    invocation_id: str | None
    fault: int | None
    traceback: bool = False


@dataclass
class Deployment:
    """One campaign's places, its ``serve`` and the ways to call through each surface."""

    app: App
    state: Path
    profile: Path
    logs: Path
    port: int
    token: str
    callgate: str
    serve: subprocess.Popen[bytes] | None = None
    probe_calls: dict[str, Call] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
        env["CALLGATE_DEV"] = "1"  # the run's sessions come from the development issuer
        env["COLUMNS"] = "200"
        return env

    def argv(self, *command: str) -> list[str]:
        return [self.callgate, "--state-dir", str(self.state), "--profile", str(self.profile),
                *command]  # fmt: skip

    def start_serve(self) -> None:
        command = self.argv("--log-format", "json", "serve", "--http", f"127.0.0.1:{self.port}")
        with (self.logs / "serve.log").open("ab") as log:
            self.serve = subprocess.Popen(command, env=self.env(), stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.serve.poll() is not None:
                raise RuntimeError(f"serve exited {self.serve.returncode}: {self.serve_log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"serve did not get ready within 60 s: {self.serve_log()[-2000:]}")

    def stop_serve(self) -> int | None:
        """SIGTERM; serve's exit code, ``None`` when it did not stop within its grace."""
        if self.serve is None:
            return None
        self.serve.send_signal(signal.SIGTERM)
        try:
            return self.serve.wait(SERVE_STOP_S)
        except subprocess.TimeoutExpired:
            self.serve.kill()
            self.serve.wait()
            return None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serve_log(self) -> str:
        return (self.logs / "serve.log").read_text(errors="replace")

    # -- probes ---------------------------------------------------------------------------

    def probe(self, surface: str, fault: int | None) -> Answer:
        try:
            code, inv, trace = getattr(self, f"_{surface}")()
        except Exception as exc:  # a probe that cannot be read is a finding, not a crash
            code, inv, trace = f"unreadable: {type(exc).__name__}: {exc}", None, False
        if inv is not None:
            self.probe_calls[inv] = Call(-1, PROBE_TOOL, "acme", None, frozenset({EXECUTED}))
        return Answer(surface, code, inv, fault, trace)

    def _cli(self) -> tuple[str, str | None, bool]:
        args = json.dumps(PROBE_ARGS)
        command = self.argv("--json", "--timeout", ANSWER_S, "propose", "--session", self.token,
                            "--tool", PROBE_TOOL, "--args", args)  # fmt: skip
        done = subprocess.run(
            command, env=self.env(), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S
        )
        return (*_code_of(json.loads(done.stdout)), "Traceback" in done.stderr)

    def _http(self) -> tuple[str, str | None, bool]:
        answer = httpx.post(
            f"{self.url}/v1/proposals?wait={ANSWER_S}",
            json={"tool": PROBE_TOOL, "args": PROBE_ARGS},
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=PROBE_TIMEOUT_S,
        )
        body = answer.json()
        return (*_code_of(body), "Traceback" in answer.text)

    def _mcp(self) -> tuple[str, str | None, bool]:
        import mcp
        from mcp.client.stdio import stdio_client

        errors = self.logs / "mcp-stderr.log"

        async def call() -> Mapping[str, Any]:
            params = mcp.StdioServerParameters(
                command=self.callgate,
                args=self.argv("--timeout", ANSWER_S, "mcp", "--session", self.token)[1:],
                env=self.env(),
            )
            with errors.open("a") as stderr:
                async with mcp.Client(stdio_client(params, errlog=stderr), cache=None) as client:
                    result = await client.call_tool(PROBE_TOOL, PROBE_ARGS)
            meta = result.meta or {}  # callgate names the outcome and the invocation here
            return {"outcome": meta.get(META_OUTCOME), "invocation_id": meta.get(META_INVOCATION)}

        before = errors.stat().st_size if errors.exists() else 0
        body = asyncio.run(asyncio.wait_for(call(), PROBE_TIMEOUT_S))
        with errors.open("rb") as f:
            f.seek(before)
            trace = b"Traceback" in f.read()
        return (*_code_of(body), trace)


def _code_of(body: Mapping[str, Any]) -> tuple[str, str | None]:
    """The code of an answer (an outcome, or a command error's code) and its invocation."""
    inv = body.get("invocation_id")
    error = body.get("error") if isinstance(body.get("error"), Mapping) else None
    code = body.get("outcome") or (error or {}).get("code") or f"no code in {body}"
    return str(code), None if inv is None else str(inv)


# --- the files of the state directory on a full disk -----------------------------------------


def write_on_full_disk(state: Path) -> list[str]:
    """Write an exporter's position and a new key set while the disk is full: each must fail
    (ENOSPC) and leave what was there before, without a temporary file. Returns what did
    not (empty: all held)."""
    problems: list[str] = []
    positions = PositionStore(state)
    before = positions.load("disk-full")
    keys = state / "keys-disk-full"
    try:
        positions.save("disk-full", Resume({"p": 2}, "after"))
        problems.append("an exporter's position was written on the full disk")
    except OSError as exc:
        if storage_failure(exc) is None:
            problems.append(f"saving a position failed otherwise: {exc}")
    if positions.load("disk-full") != before:
        problems.append(f"the exporter's position changed: {positions.load('disk-full')}")
    try:
        generate_key_pair(keys, "approval", "EdDSA", "k2")
        problems.append("a key pair was written on the full disk")
    except OSError as exc:
        if storage_failure(exc) is None:
            problems.append(f"writing a key pair failed otherwise: {exc}")
    left = sorted(p.name for p in keys.iterdir() if p.name not in KEYS_BEFORE)
    if left:
        problems.append(f"files left of the refused key pair: {left}")
    for folder in (positions.folder, keys):
        problems += [f"temporary file left: {p}" for p in folder.glob(".tmp-*")]
    return problems


KEYS_BEFORE = ("k1.pem", "k1.pub.pem", "approval-jwks.json")


def prepare_files(state: Path) -> None:
    """What ``write_on_full_disk`` must find intact: a position and one key pair."""
    PositionStore(state).save("disk-full", Resume({"p": 1}, "before"))
    generate_key_pair(state / "keys-disk-full", "approval", "EdDSA", "k1")
