"""``make bench-agent``: the time callgate adds to an agent's tool call, on the agent's path.

The same read-only MCP tool call is made directly to an upstream MCP server and through
``callgate mcp --http`` in front of it, with the official MCP SDK client over streamable
HTTP, alternating A/B so both paths see the same machine. Measured:

- start: from starting ``callgate mcp`` (and ``callgate serve`` on Kafka) to the first
  call's answer;
- sequential, cold: the first call after the processes started (one call per path);
- sequential, warm: one agent, one call at a time, after 20 untimed calls per path;
- concurrent, cold: ``agents`` agents opening a session each at once, their first call;
- concurrent, warm: the same agents' further calls, all at once.

The HTTP API path is the same call as a plain ``POST /v1/proposals`` through
``callgate serve --http``, against the same direct upstream call (sequential and
concurrent, warm). Each case is three rows: the p50/p95/p99 of the direct call, of the
call through callgate, and the overhead (difference and ratio of the percentiles); on the
embedded backend and on Apache Kafka (a broker started from the Maven jars, ``callgate
serve`` beside ``callgate mcp``). Loopback only. ``python -m tools bench --only agent``
prints the same rows in the bench's table (``agent_rows``).

Usage limits (ADR 0079): ``notes.peek`` is ``notes.read`` under a limit that never refuses
(a count per actor per day far above the calls made); the same agent calls both through
``callgate mcp``, alternated A/B in one run, and the rows give the cost of the limit
(``--limits-only`` measures just that).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx
import mcp
import yaml
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from tests.mcp_support import UPSTREAM, write_profile

from callgate.bootstrap import Settings, bootstrap
from tools.bench_core import Row
from tools.ports import free_ports, wait_port

NOTE = "N-1"
CALLGATE = str(Path(sys.executable).with_name("callgate"))
WARM_UP = 20  # untimed calls per path before the sequential warm ones
UNLIMITED = {"CALLGATE_HTTP_RATE_PER_S": "1000000", "CALLGATE_HTTP_RATE_BURST": "1000000"}

Call = Callable[[], Awaitable[None]]
# Opens one agent's session on a path and yields its call (closed with the session).
Path_ = Callable[[], contextlib.AbstractAsyncContextManager[Call]]


@contextlib.asynccontextmanager
async def client(url: str, token: str | None = None) -> AsyncIterator[mcp.Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = create_mcp_http_client(headers=headers)
    async with http, mcp.Client(streamable_http_client(url, http_client=http), cache=None) as c:
        yield c


def mcp_path(url: str, tool: str, token: str | None = None) -> Path_:
    """One agent's MCP session calling ``tool`` on the note (a tool error raises)."""

    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[Call]:
        async with client(url, token) as c:

            async def call() -> None:
                result = await c.call_tool(tool, {"note_id": NOTE})
                if result.is_error:
                    raise RuntimeError(f"{tool} failed: {str(result.content)[:300]}")

            yield call

    return session


def http_path(url: str, token: str) -> Path_:
    """One agent's plain HTTP client proposing ``notes.read`` (anything but 200 raises)."""

    @contextlib.asynccontextmanager
    async def session() -> AsyncIterator[Call]:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as c:

            async def call() -> None:
                body = {"tool": "notes.read", "args": {"note_id": NOTE}}
                answer = await c.post("/v1/proposals", json=body)
                if answer.status_code != 200:
                    raise RuntimeError(f"POST /v1/proposals: {answer.status_code} {answer.text}")

            yield call

    return session


def percentiles(ms: Sequence[float]) -> tuple[float, float, float]:
    if len(ms) == 1:
        return ms[0], ms[0], ms[0]
    cuts = statistics.quantiles(ms, n=100, method="inclusive")
    return cuts[49], cuts[94], cuts[98]


@dataclass
class Case:
    """One measured case: the direct call's and the gated call's times (ms)."""

    name: str
    about: str  # what the calls are, for the rows' notes
    direct: list[float] = field(default_factory=list)
    through: list[float] = field(default_factory=list)


def case_rows(prefix: str, case: Case, gate: str) -> list[Row]:
    """Three rows: each path's p50/p95/p99 (one call: its time) and the overhead."""
    d, t = percentiles(case.direct), percentiles(case.through)
    one = len(case.direct) == 1 and len(case.through) == 1

    def ms(v: tuple[float, float, float]) -> str:
        return f"{v[0]:.1f} ms" if one else " / ".join(f"{x:.1f}" for x in v) + " ms"

    pairs = list(zip(d, t, strict=True))[: 1 if one else 3]
    over = " / ".join(f"{b - a:+.1f}" for a, b in pairs) + " ms ("
    over += " / ".join(f"{b / a:.1f}x" for a, b in pairs) + ")"
    n = "one call" if one else f"p50 / p95 / p99 of {len(case.direct)} calls"
    head = f"{prefix}, {case.name}"
    return [
        Row(f"{head}: direct", ms(d), note=f"{case.about}; {n}"),
        Row(f"{head}: through callgate", ms(t), note=f"through {gate}; {n}"),
        Row(f"{head}: overhead", over, note="through minus direct (through / direct)"),
    ]


async def timed(call: Call) -> float:
    started = time.perf_counter()
    await call()
    return (time.perf_counter() - started) * 1000


async def sequential(direct: Path_, through: Path_, calls: int, warm_up: int = WARM_UP) -> Case:
    """``calls`` sequential calls per path, alternated A/B, after ``warm_up`` of each."""
    case = Case("sequential, warm", f"after {warm_up} untimed calls per path")
    async with direct() as d, through() as t:
        for _ in range(warm_up):
            await d()
            await t()
        for _ in range(calls):
            case.direct.append(await timed(d))
            case.through.append(await timed(t))
    return case


async def concurrent(direct: Path_, through: Path_, calls: int, agents: int) -> list[Case]:
    """``agents`` agents at once, each its own session: their first calls (cold) and
    ``calls // agents`` (at least 5) further calls each (warm); direct, then through,
    twice (A/B)."""
    cold = Case(f"{agents} agents, cold", f"{agents} concurrent sessions, each one's first call")
    warm = Case(f"{agents} agents, warm", f"{agents} concurrent sessions, later calls")
    per_agent = max(5, calls // agents)

    async def agent(path: Path_, first: list[float], rest: list[float]) -> None:
        async with path() as call:
            first.append(await timed(call))
            for _ in range(per_agent):
                rest.append(await timed(call))

    for _round in range(2):
        for path, first, rest in (
            (direct, cold.direct, warm.direct),
            (through, cold.through, warm.through),
        ):
            async with anyio.create_task_group() as tg:
                for _ in range(agents):
                    tg.start_soon(agent, path, first, rest)
    return [cold, warm]


async def answered(call: Call, bound_s: float = 120.0) -> int:
    """Calls ``call`` until it answers (at most ``bound_s``), untimed: a path's first call
    of a kind may be refused while the part of the pipeline it needs starts. How many were
    refused before the answer."""
    started, refused = time.perf_counter(), 0
    while True:
        try:
            await call()
            return refused
        except RuntimeError:
            refused += 1
            if time.perf_counter() - started > bound_s:
                raise
            await anyio.sleep(0.2)


async def first_calls(
    spare: Path_, direct: Path_, through: Path_, started: float
) -> tuple[Case, float, int]:
    """The first call after start on each path (one each), the time from ``started`` to the
    gated call's answer, and how many gated calls were refused before it (the Kafka
    pipeline still starting). An untimed call to ``spare`` first: the bench's own first
    call pays for its client's first use."""
    case = Case("sequential, cold", "the first call after start")
    async with spare() as s:
        await s()
    async with direct() as d:
        case.direct.append(await timed(d))
    refused = 0
    async with through() as t:
        while True:
            try:
                case.through.append(await timed(t))
                break
            except RuntimeError:
                refused += 1
                if time.perf_counter() - started > 300:
                    raise
    return case, (time.perf_counter() - started) * 1000, refused


# Offered loads (calls/s) of the sweep, and how long each runs per path.
SWEEP_RATES = (10, 25, 50, 100, 200)
SWEEP_S = 4.0


async def offered(path: Path_, rate: float, seconds: float) -> list[float]:
    """Calls at ``rate`` per second for ``seconds`` on one session of ``path`` (calls
    overlap when one takes longer than the interval), each timed from its *scheduled*
    start: a path that falls behind adds its delay instead of hiding it."""
    times: list[float] = []
    async with path() as call:
        await call()  # untimed: the session is open and warm

        async def one(scheduled: float) -> None:
            await call()
            times.append((time.perf_counter() - scheduled) * 1000)

        async with anyio.create_task_group() as tg:
            start = time.perf_counter()
            for i in range(int(rate * seconds)):
                scheduled = start + i / rate
                await anyio.sleep(max(0.0, scheduled - time.perf_counter()))
                tg.start_soon(one, scheduled)
    return times


async def sweep(
    direct: Path_, through: Path_, rates: Sequence[float], seconds: float
) -> dict[float, Case]:
    """Per offered load, the direct path's and the gated path's latencies (one after the
    other at each rate, the rates in increasing order)."""
    found: dict[float, Case] = {}
    for rate in rates:
        case = Case(f"{rate:g} calls/s offered", f"{int(rate * seconds)} calls in {seconds:g} s")
        case.direct = await offered(direct, rate, seconds)
        case.through = await offered(through, rate, seconds)
        found[rate] = case
    return found


def plot_sweep(sweeps: dict[str, dict[float, Case]], path: Path) -> str:
    """Latency against offered load, p50 and p99, direct and through callgate, a panel per
    backend; returns what was written (or why nothing was)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed"
    figure, axes = plt.subplots(1, len(sweeps), figsize=(6.5 * len(sweeps), 4.6), squeeze=False)
    for ax, (backend, cases) in zip(axes[0], sweeps.items(), strict=True):
        rates = sorted(cases)
        for label, attr, style in (
            ("direct", "direct", "-"),
            ("through callgate", "through", "--"),
        ):
            for q, marker in ((0, "o"), (2, "^")):
                values = [percentiles(getattr(cases[r], attr))[q] for r in rates]
                name = f"{label} p{(50, 95, 99)[q]}"
                ax.plot(rates, values, style, marker=marker, label=name)
        ax.set_yscale("log")
        ax.set_xlabel("offered load (calls/s)")
        ax.set_ylabel("scheduled start → answer (ms)")
        ax.set_title(f"MCP tools/call, {backend} backend")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle(f"The agent's path: direct and through callgate mcp ({os.cpu_count()} cores)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return str(path)


@dataclass
class Running:
    """The processes of one measurement: upstreams of the same code and notes (one
    called directly, one behind callgate, so that each path's first call meets a cold
    upstream, and a spare), ``callgate mcp --http`` and, when asked for, ``callgate serve
    --http``."""

    direct: str  # the MCP URL of the upstream called directly
    gateway: str
    token: str
    started: float  # perf_counter when callgate started
    api: str | None = None
    spare: str = ""  # an upstream no timed call uses: warms the bench's own client code
    api_token: str | None = None


@contextlib.contextmanager
def running(backend: str, bootstrap_servers: str = "", http: bool = False) -> Iterator[Running]:
    """Starts the upstreams, then callgate (timed from ``Running.started``), in a temporary
    directory; stops all of them on exit. ``http``: also ``callgate serve --http`` (on
    Kafka the serve that runs the pipeline; embedded, one on a state directory of its own)."""
    with tempfile.TemporaryDirectory(prefix="callgate-bench-agent-") as tmp:
        root = Path(tmp)
        ledger = root / "notes.jsonl"
        # The note every call reads, there from the start (the upstream folds its ledger).
        note = {"note_id": NOTE, "text": "bench", "tool": "write_note"}
        ledger.write_text(json.dumps(note, sort_keys=True) + "\n")
        up_port, direct_port, spare_port, gw_port, api_port = free_ports(5)
        upstream_url = f"http://127.0.0.1:{up_port}/mcp"
        profile = limited(write_profile(root / "profile", ledger, url=upstream_url))
        env = {**os.environ, "CALLGATE_DEV": "1", "CALLGATE_TOPIC_PREFIX": f"bench-{up_port}"}
        env |= UNLIMITED  # the bench's agents share one token: no 429 from the API's buckets

        def argv(state: Path) -> list[str]:
            args = [CALLGATE, "--state-dir", str(state), "--profile", str(profile)]
            if backend == "kafka":
                args += ["--backend", "kafka", "--bootstrap-servers", bootstrap_servers]
            return args

        def token(state: Path) -> str:
            app = bootstrap(Settings(state_dir=state, profile=profile, dev=True))
            return app.session_issuer.issue("alice", "acme", ["support"], app.clock(), 86_400)

        state, api_state = root / "state", root / "api-state"
        state.mkdir()
        api_state.mkdir()
        procs: list[subprocess.Popen[bytes]] = []
        logs: dict[int, Path] = {}  # a started callgate's pid -> the file of its stderr

        def quiet(args: list[str]) -> subprocess.Popen[bytes]:
            """``args`` started, its stderr kept in a log that ``wait_port`` shows."""
            log = root / f"{len(procs)}-{args[-1].replace(':', '_')}.log"
            with log.open("wb") as err:
                proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, env=env)
            logs[proc.pid] = log
            return proc

        try:
            # callgate's upstream, the direct one, one that warms the bench's own client
            for port in (up_port, direct_port, spare_port):
                up = subprocess.Popen(
                    [sys.executable, "-P", str(UPSTREAM), "--ledger", str(ledger), "--http",
                     f"127.0.0.1:{port}"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                procs.append(up)
                wait_port(port, up)
            direct_url = f"http://127.0.0.1:{direct_port}/mcp"
            found = Running(direct_url, f"http://127.0.0.1:{gw_port}/mcp", "", 0.0)
            found.spare = f"http://127.0.0.1:{spare_port}/mcp"
            found.token = token(state)
            api_http = ["--http", f"127.0.0.1:{api_port}"] if http else []
            found.started = time.perf_counter()
            serve = None
            if backend == "kafka":  # the pipeline runs in serve; mcp publishes and follows
                procs.append(serve := quiet([*argv(state), "serve", *api_http]))
            gw = quiet([*argv(state), "mcp", "--http", f"127.0.0.1:{gw_port}"])
            procs.append(gw)
            wait_port(gw_port, gw, logs[gw.pid])
            if http:
                if serve is not None:
                    found.api_token = found.token
                else:
                    found.api_token = token(api_state)
                    procs.append(serve := quiet([*argv(api_state), "serve", *api_http]))
                wait_port(api_port, serve, logs[serve.pid])
                found.api = f"http://127.0.0.1:{api_port}"
            yield found
        finally:
            for p in reversed(procs):
                p.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(20)
                if p.poll() is None:
                    p.kill()


LIMITED_TOOL = "notes.peek"


def limited(profile: Path) -> Path:
    """``profile`` with ``notes.peek``, ``notes.read`` under a limit no call reaches."""
    doc = yaml.safe_load(profile.read_text())
    doc["tools"][LIMITED_TOOL] = {**doc["tools"]["notes.read"], "description": "Limited read."}
    doc["limits"] = [
        {"name": "peeks", "tools": [LIMITED_TOOL], "max": 10**9, "window": "24h",
         "per": ["actor"]}
    ]  # fmt: skip
    profile.write_text(yaml.safe_dump(doc, sort_keys=False))
    return profile


async def under_limit(gateway: str, token: str, calls: int) -> Case:
    """The same call without a limit (``direct``) and under one (``through``), A/B."""
    case = Case("a call under a limit", f"{LIMITED_TOOL} (limited) against notes.read")
    free, capped = mcp_path(gateway, "notes.read", token), mcp_path(gateway, LIMITED_TOOL, token)
    async with free() as a, capped() as b:
        await answered(b)  # the first limited call also starts the usage process's round
        for _ in range(WARM_UP):
            await a()
            await b()
        for _ in range(calls):
            case.direct.append(await timed(a))
            case.through.append(await timed(b))
    return case


def limit_rows(prefix: str, case: Case) -> list[Row]:
    """Three rows: the call without a limit, under one, and what the limit costs."""
    d, t = percentiles(case.direct), percentiles(case.through)
    n = f"p50 / p95 / p99 of {len(case.direct)} calls through callgate mcp, A/B"
    cost = " / ".join(f"{b - a:+.1f}" for a, b in zip(d, t, strict=True)) + " ms"
    return [
        Row(f"{prefix}, same call without a limit", " / ".join(f"{x:.1f}" for x in d) + " ms",
            note=f"notes.read; {n}"),
        Row(f"{prefix}, same call under a limit", " / ".join(f"{x:.1f}" for x in t) + " ms",
            note=f"{LIMITED_TOOL}: one limit, never reached; {n}"),
        Row(f"{prefix}, what the limit costs", cost, note="under minus without"),
    ]  # fmt: skip


def limits_only(backend: str, calls: int, bootstrap_servers: str = "") -> list[Row]:
    """The limit's rows alone (``--limits-only``)."""
    with running(backend, bootstrap_servers) as run:

        async def measure() -> Case:
            async with mcp_path(run.gateway, "notes.read", run.token)() as first:
                await first()  # until the pipeline answers
            return await under_limit(run.gateway, run.token, calls)

        case = anyio.run(measure)
    return limit_rows(f"agent ({backend}) MCP", case)


def agent_rows(
    backend: str,
    calls: int,
    agents: int,
    bootstrap_servers: str = "",
    http: bool = True,
    swept: dict[str, dict[float, Case]] | None = None,
    rates: Sequence[float] = (),
) -> list[Row]:
    """One backend's rows (the module docstring): start, then per case direct, through
    callgate and overhead; the MCP path, then (``http``) the HTTP API path; last, the load
    average (the figures shrink and spread as it grows). With ``rates``, the MCP path at
    those offered loads too, its cases kept in ``swept[backend]`` for the plot."""
    prefix = f"agent ({backend})"
    with running(backend, bootstrap_servers, http) as run:
        direct = mcp_path(run.direct, "read_note")
        through = mcp_path(run.gateway, "notes.read", run.token)

        async def mcp_cases() -> tuple[list[Case], float, int, Case]:
            cold, start_ms, refused = await first_calls(
                mcp_path(run.spare, "read_note"), direct, through, run.started
            )
            warm = await sequential(direct, through, calls)
            capped = await under_limit(run.gateway, run.token, calls)
            many = await concurrent(direct, through, calls, agents)
            if rates and swept is not None:
                swept[backend] = await sweep(direct, through, rates, SWEEP_S)
            return [cold, warm, *many], start_ms, refused, capped

        cases, start_ms, refused, capped = anyio.run(mcp_cases)
        what = "serve and mcp" if backend == "kafka" else "callgate mcp"
        note = f"{refused} calls refused before it (the pipeline starting)" if refused else ""
        rows = [Row(f"{prefix}: start of {what} to the first answer", f"{start_ms:,.0f} ms",
                    note=note)]  # fmt: skip
        for case in [*cases, *((swept or {}).get(backend, {}).values())]:
            rows += case_rows(f"{prefix} MCP", case, "callgate mcp")
        rows += limit_rows(f"{prefix} MCP", capped)
        if run.api is not None and run.api_token is not None:
            api = http_path(run.api, run.api_token)

            async def api_cases() -> list[Case]:
                warm = await sequential(direct, api, calls)
                return [warm, (await concurrent(direct, api, calls, agents))[1]]

            for case in anyio.run(api_cases):
                rows += case_rows(f"{prefix} HTTP API", case, "callgate serve --http")
    load = f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    return [*rows, Row(f"{prefix}: load average after the rows", load, note="1 minute")]


def sequential_p50s(calls: int, warm_up: int = WARM_UP) -> tuple[float, float]:
    """The p50 (ms) of ``calls`` sequential calls direct and through ``callgate mcp --http``,
    alternated A/B, on the embedded backend (``tools.bench_guard``)."""
    with running("embedded") as run:
        direct = mcp_path(run.direct, "read_note")
        through = mcp_path(run.gateway, "notes.read", run.token)

        async def both() -> Case:
            async with through() as t:  # wait until it answers (the first call, untimed)
                await t()
            return await sequential(direct, through, calls, warm_up)

        case = anyio.run(both)
    return statistics.median(case.direct), statistics.median(case.through)


def printed(rows: Sequence[Row]) -> str:
    """The rows as plain lines: measure, value, note."""
    width = max(len(r.measure) for r in rows)
    return "\n".join(f"{r.measure:<{width}}  {r.value:<34}  {r.note}".rstrip() for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--backend", choices=["embedded", "kafka", "both"], default="both")
    parser.add_argument("--no-http", action="store_true", help="the MCP path only")
    parser.add_argument(
        "--limits-only", action="store_true", help="only a call under a limit against one without"
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE",
        help="also sweep offered loads (calls/s: "
        + ", ".join(f"{r:g}" for r in SWEEP_RATES)
        + ") and plot latency against load, direct and through callgate, to FILE",
    )
    ns = parser.parse_args()
    rows: list[Row] = []
    swept: dict[str, dict[float, Case]] = {}
    rates = SWEEP_RATES if ns.plot else ()
    if ns.limits_only:
        if ns.backend in ("embedded", "both"):
            rows += limits_only("embedded", ns.calls)
        if ns.backend in ("kafka", "both"):
            from tools.apache_kafka import ApacheKafka

            with ApacheKafka() as broker:
                rows += limits_only("kafka", ns.calls, broker.bootstrap)
        print(printed(rows))
        return
    if ns.backend in ("embedded", "both"):
        rows += agent_rows(
            "embedded", ns.calls, ns.agents, http=not ns.no_http, swept=swept, rates=rates
        )
    if ns.backend in ("kafka", "both"):
        from tools.apache_kafka import ApacheKafka

        with ApacheKafka() as broker:
            rows += agent_rows(
                "kafka", ns.calls, ns.agents, broker.bootstrap, not ns.no_http, swept, rates
            )
    print(printed(rows))
    if ns.plot:
        print(f"latency against offered load: {plot_sweep(swept, ns.plot)}")


if __name__ == "__main__":
    main()
