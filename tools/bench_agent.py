"""``make bench-agent``: the time callgate adds to an agent's tool call, on the agent's path.

The same read-only MCP tool call is made directly to an upstream MCP server and through
``callgate mcp --http`` in front of it, with the official MCP SDK client over streamable
HTTP, alternating A/B call by call so both paths see the same machine. Measured:

- cold: from starting ``callgate mcp`` to the first call's answer;
- sequential: one agent, one call at a time;
- concurrent: ``--agents`` agents (one MCP session each) calling at once.

Each row prints p50/p95/p99 of the direct call, of the call through callgate, and the
overhead (difference and ratio of the percentiles); on the embedded backend and on Apache
Kafka (a broker started from the Maven jars, ``callgate serve`` beside ``callgate mcp``).
Loopback only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import mcp
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from tests.mcp_support import UPSTREAM, write_profile

from callgate.bootstrap import Settings, bootstrap

NOTE = "N-1"
CALLGATE = str(Path(sys.executable).with_name("callgate"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port} after {timeout_s} s")


@contextlib.asynccontextmanager
async def client(url: str, token: str | None = None) -> AsyncIterator[mcp.Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = create_mcp_http_client(headers=headers)
    async with http, mcp.Client(streamable_http_client(url, http_client=http), cache=None) as c:
        yield c


def percentiles(ms: list[float]) -> tuple[float, float, float]:
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    return cuts[49], cuts[94], cuts[98]


def row(label: str, direct: list[float], through: list[float]) -> str:
    """Three lines: each path's p50/p95/p99 in ms, and the overhead (difference, ratio)."""
    d, t = percentiles(direct), percentiles(through)
    over = "  ".join(f"{b - a:+7.1f} ({b / a:4.1f}x)" for a, b in zip(d, t, strict=True))
    return (
        f"{label} ({len(direct)} + {len(through)} calls)\n"
        f"  {'direct':<16}" + "".join(f"{v:>10.1f}" for v in d) + "\n"
        f"  {'through callgate':<16}" + "".join(f"{v:>10.1f}" for v in t) + "\n"
        f"  {'overhead':<16}  {over}"
    )


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    result = await call()
    if getattr(result, "is_error", False) or getattr(result, "isError", False):
        raise SystemExit(f"the call failed: {result}")
    return (time.perf_counter() - started) * 1000


async def measure(upstream: str, gateway: str, token: str, calls: int, agents: int) -> None:
    async def one_direct(c: mcp.Client) -> Any:
        return await c.call_tool("read_note", {"note_id": NOTE})

    async def one_through(c: mcp.Client) -> Any:
        return await c.call_tool("notes.read", {"note_id": NOTE})

    d_ms: list[float] = []
    t_ms: list[float] = []
    async with client(upstream) as direct, client(gateway, token) as through:
        for _ in range(20):  # warm both paths
            await one_direct(direct)
            await one_through(through)
        for _ in range(calls):
            d_ms.append(await timed(lambda: one_direct(direct)))
            t_ms.append(await timed(lambda: one_through(through)))
    print(row("sequential", d_ms, t_ms))

    async def agent(url: str, tok: str | None, one: Any, out: list[float], n: int) -> None:
        async with client(url, tok) as c:
            await one(c)
            for _ in range(n):
                out.append(await timed(lambda: one(c)))

    d_ms, t_ms = [], []
    per_agent = max(5, calls // agents)
    for _round in range(2):  # A/B twice: both paths see the same machine
        async with anyio.create_task_group() as tg:
            for _ in range(agents):
                tg.start_soon(agent, upstream, None, one_direct, d_ms, per_agent)
        async with anyio.create_task_group() as tg:
            for _ in range(agents):
                tg.start_soon(agent, gateway, token, one_through, t_ms, per_agent)
    print(row(f"{agents} concurrent agents", d_ms, t_ms))


def run_backend(backend: str, calls: int, agents: int, bootstrap_servers: str = "") -> None:
    """One backend's rows: cold start, sequential, concurrent."""
    with tempfile.TemporaryDirectory(prefix="callgate-bench-agent-") as tmp:
        root = Path(tmp)
        ledger = root / "notes.jsonl"
        # The note every call reads, there from the start (the upstream folds its ledger).
        note = {"note_id": NOTE, "text": "bench", "tool": "write_note"}
        ledger.write_text(json.dumps(note, sort_keys=True) + "\n")
        up_port, gw_port = free_port(), free_port()
        upstream_url = f"http://127.0.0.1:{up_port}/mcp"
        profile = write_profile(root / "profile", ledger, url=upstream_url)
        state = root / "state"
        state.mkdir()
        env = {**os.environ, "CALLGATE_DEV": "1", "CALLGATE_TOPIC_PREFIX": f"bench-{up_port}"}
        common = [CALLGATE, "--state-dir", str(state), "--profile", str(profile)]
        if backend == "kafka":
            common += ["--backend", "kafka", "--bootstrap-servers", bootstrap_servers]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            up = subprocess.Popen(
                [sys.executable, "-P", str(UPSTREAM), "--ledger", str(ledger), "--http",
                 f"127.0.0.1:{up_port}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            procs.append(up)
            wait_port(up_port, up)
            app = bootstrap(Settings(state_dir=state, profile=profile, dev=True))
            token = app.session_issuer.issue("alice", "acme", ["support"], app.clock())
            started = time.perf_counter()
            if backend == "kafka":  # the pipeline runs in serve; mcp publishes and follows
                log = (root / "serve.log").open("wb")
                procs.append(subprocess.Popen([*common, "serve"], stdout=log, stderr=log, env=env))
            gw = subprocess.Popen(
                [*common, "mcp", "--http", f"127.0.0.1:{gw_port}"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            )  # fmt: skip
            procs.append(gw)
            wait_port(gw_port, gw)
            gateway_url = f"http://127.0.0.1:{gw_port}/mcp"

            refused: list[str] = []

            async def first() -> None:
                async with client(gateway_url, token) as c:
                    result = await c.call_tool("notes.read", {"note_id": NOTE})
                    while result.is_error and time.perf_counter() - started < 300:
                        refused.append(str(result.content)[:200])
                        result = await c.call_tool("notes.read", {"note_id": NOTE})
                    if result.is_error:
                        raise SystemExit(f"no answer within 300 s: {result.content}")

            anyio.run(first)
            cold_ms = (time.perf_counter() - started) * 1000
            print(f"agent's path, {backend} backend, MCP streamable HTTP, official SDK client")
            what = "serve and mcp" if backend == "kafka" else "callgate mcp"
            print(f"cold: start of {what} to the first call's answer: {cold_ms:,.0f} ms")
            if refused:
                print(f"  ({len(refused)} calls refused before it, the first: {refused[0]})")
            print(f"  {'ms':<16}{'p50':>10}{'p95':>10}{'p99':>10}")
            anyio.run(measure, upstream_url, gateway_url, token, calls, agents)
        finally:
            for p in reversed(procs):
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(20)
                if p.poll() is None:
                    p.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--backend", choices=["embedded", "kafka", "both"], default="both")
    ns = parser.parse_args()
    if ns.backend in ("embedded", "both"):
        run_backend("embedded", ns.calls, ns.agents)
    if ns.backend in ("kafka", "both"):
        from tools.apache_kafka import ApacheKafka

        with ApacheKafka() as broker:
            run_backend("kafka", ns.calls, ns.agents, broker.bootstrap)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
