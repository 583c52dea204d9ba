"""``make conformance``: the official MCP conformance suite, upstream alone and through callgate.

1. starts ``tests/conformance/upstream.py`` (an MCP server on the official Python SDK) and
   runs the suite's server requirement sets (2025-11-25, 2026-07-28) against it;
2. starts ``callgate mcp --http`` in front of it, with a profile that catalogs every
   upstream tool as a low-impact read any ``agent`` may call (a policy that allows
   everything), and runs the same sets through it.

3. reads, from the 2026-07-28 run through callgate, the Tasks extension's scenarios
   (``tasks-*``, SEP-2663; the suite runs them unscored): callgate serves the tasks
   (ADR 0086) whatever its upstream does, and the upstream serves none; ``TASKS_LOST``
   lists the ones that fail, with their reasons in the docs.

The suite's client cannot send a header, and ``callgate mcp --http`` wants each request's
session as ``Authorization: Bearer``: a small forwarding proxy adds it, as an MCP host's
configuration does (everything else, ``Host`` and ``Origin`` included, passes unchanged).

Prints, per requirement set, the required scenarios passed upstream alone and through
callgate, and the ones that pass alone but not through callgate. Exit status 0 when those
are exactly the exceptions ``KNOWN_LOST`` lists (each with its reason in
docs/how-to/integrations.md): a new loss fails, and so does a listed one that now passes
(the list and the docs must then shrink).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))  # run with -P: the repository's tools, not this folder's files
from tools.ports import free_port  # noqa: E402

CALLGATE = Path(sys.executable).with_name("callgate")
REVISIONS = ("2025-11-25", "2026-07-28")
NODE = os.environ.get("CALLGATE_CONFORMANCE_NODE", "node@22")
ALLOWED_ROLE = "agent"
# callgate's session to the upstream: the 2025-11-25 handshake keeps subscriptions.
MODE = os.environ.get("CALLGATE_CONFORMANCE_UPSTREAM_MODE", "legacy")

# The upstream fixture's tools and their arguments (tests/conformance/upstream.py).
TOOLS: dict[str, dict[str, Any]] = {
    "test_simple_text": {},
    "test_image_content": {},
    "test_audio_content": {},
    "test_embedded_resource": {},
    "test_multiple_content_types": {},
    "test_tool_with_logging": {},
    "test_tool_with_progress": {},
    "test_error_handling": {},
    "test_sampling": {"prompt": {"type": "string"}},
    "test_missing_capability": {},
    "test_elicitation": {"message": {"type": "string"}},
    "test_elicitation_sep1034_defaults": {},
    "test_elicitation_sep1330_enums": {},
    # the tasks-* scenarios' (SEP-2663; callgate answers them with tasks, ADR 0086)
    "greet": {"name": {"type": "string"}},
    "slow_compute": {"seconds": {"type": "number"}, "label": {"type": "string"}},
    "failing_job": {},
    "protocol_error_job": {},
    "test_tool_with_task": {},
    "confirm_delete": {"filename": {"type": "string"}},
    "multi_input": {},
    **{
        f"test_input_required_result_{name}": {}
        for name in (
            "elicitation",
            "sampling",
            "list_roots",
            "request_state",
            "tampered_state",
            "multiple_inputs",
            "multi_round",
            "capabilities",
        )
    },
}
# Required scenarios that pass alone but not through callgate (the docs' table says why).
KNOWN_LOST: dict[str, frozenset[str]] = {
    "2025-11-25": frozenset(),
    "2026-07-28": frozenset(),
}

# ``--quick`` (``make test``): one scenario of each feature callgate relays, through
# callgate only (``make conformance`` checks each passes alone too).
QUICK: dict[str, tuple[str, ...]] = {
    "2025-11-25": (
        "tools-call-with-progress", "tools-call-with-logging", "tools-call-elicitation",
        "tools-call-sampling", "resources-read-text", "prompts-get-with-args",
    ),
    "2026-07-28": (
        "input-required-result-multiple-input-requests", "input-required-result-multi-round",
        "input-required-result-tampered-state", "input-required-result-non-tool-request",
    ),
}  # fmt: skip

# The Tasks extension's scenarios (SEP-2663), run through callgate alone: callgate serves
# the tasks (ADR 0086) whatever its upstream does, and this upstream serves none.
TASKS: tuple[str, ...] = (
    "tasks-capability-negotiation", "tasks-lifecycle", "tasks-wire-fields",
    "tasks-request-state-removal", "tasks-dispatch-and-envelope", "tasks-status-notifications",
    "tasks-request-headers", "tasks-required-task-error", "tasks-mrtr-input",
    "tasks-mrtr-composition",
)  # fmt: skip

# Tools the tasks-* scenarios register with task support ``required``.
REQUIRE_TASKS = ("failing_job", "test_tool_with_task")
# Tasks scenarios that fail through callgate, each with its reason in
# docs/how-to/integrations.md ("Conformance"); a new failure fails, and so does a listed
# one that now passes.
TASKS_LOST: frozenset[str] = frozenset()

# Its resources (catalog entries of resources/read, by URI glob) and prompts.
RESOURCES: dict[str, list[str]] = {
    "up.static": ["test://static-text", "test://static-binary", "test://watched-resource"],
    "up.template": ["test://template/*/data"],
}
PROMPTS: dict[str, list[str]] = {
    "test_simple_prompt": [],
    "test_prompt_with_arguments": ["arg1", "arg2"],
    "test_prompt_with_embedded_resource": ["resourceUri"],
    "test_prompt_with_image": [],
    "test_input_required_result_prompt": [],
}


def wait_listening(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"did not listen on {port}:\n{log.read_text()}")
        time.sleep(0.1)


@contextlib.contextmanager
def process(args: list[str], port: int, log: Path, env: dict[str, str]) -> Iterator[None]:
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_listening(port, proc, log)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def write_profile(folder: Path, upstream_url: str) -> Path:
    """Every upstream tool catalogued as a read any ``agent`` may call, no approval."""
    default = REPO / "services" / "callgate" / "profiles" / "default.cedar"
    (folder / "policy.cedar").write_text(default.read_text())
    tools: dict[str, dict[str, Any]] = {
        name: {
            "description": f"The upstream's {name}.",
            "provider": "up",
            "upstream_tool": name,
            "mutation": False,
            "impact": "low",
            "require_dry_run": False,
            "confirmation": "none",
            "target_arg": None,
            "callers": [ALLOWED_ROLE],
            "args_schema": {"type": "object", "properties": props},
        }
        for name, props in TOOLS.items()
    }
    for name in REQUIRE_TASKS:  # for agents that declared Tasks only (ADR 0086)
        tools[name]["task_support"] = "required"
    uri_schema: dict[str, Any] = {
        "type": "object",
        "required": ["uri"],
        "properties": {"uri": {"type": "string", "maxLength": 2048}},
        "additionalProperties": False,
    }
    for name, uris in RESOURCES.items():
        tools[name] = {
            "description": f"Reads of {', '.join(uris)}.",
            "provider": "up",
            "upstream_method": "resources/read",
            "uris": uris,
            "mutation": False,
            "impact": "low",
            "require_dry_run": False,
            "confirmation": "none",
            "target_arg": "uri",
            "callers": [ALLOWED_ROLE],
            "args_schema": uri_schema,
        }
    for name, props in PROMPTS.items():
        tools[name] = {
            "description": f"The upstream's prompt {name}.",
            "provider": "up",
            "upstream_method": "prompts/get",
            "upstream_tool": name,
            "mutation": False,
            "impact": "low",
            "require_dry_run": False,
            "confirmation": "none",
            "target_arg": None,
            "callers": [ALLOWED_ROLE],
            "args_schema": {
                "type": "object",
                "properties": {p: {"type": "string", "maxLength": 4096} for p in props},
                "additionalProperties": False,
            },
        }
    doc = {
        "version": 1,
        "policy_file": "policy.cedar",
        "resources": {"acme": ["test://*"]},
        # A scenario that leaves a round unanswered holds the upstream's call until the
        # answer times out; the embedded pipeline waits with it (ADR 0075), so a short one.
        "providers": {
            "up": {
                "kind": "mcp",
                "url": upstream_url,
                "timeout_s": 20,
                "mode": MODE,
                "answer_timeout_s": 2,
            }
        },
        "tools": tools,
    }
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def session_token(state_dir: Path, profile: Path) -> str:
    from callgate.bootstrap import bootstrap
    from callgate.settings import Settings

    app = bootstrap(Settings(state_dir=state_dir, profile=profile, dev=True))
    return app.session_issuer.issue("conformance", "acme", [ALLOWED_ROLE], app.clock())


def bearer_proxy(target: str, token: str) -> Any:
    """An ASGI app forwarding every request to ``target`` with the session as a bearer
    token; responses (SSE included) stream back as they come."""
    client = httpx.AsyncClient(timeout=httpx.Timeout(60.0))

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k.lower() not in (b"authorization", b"content-length")
        ]
        headers.append(("authorization", f"Bearer {token}"))
        url = (
            target
            + scope["path"]
            + (f"?{scope['query_string'].decode()}" if scope["query_string"] else "")
        )
        request = client.build_request(scope["method"], url, headers=headers, content=body)
        response = await client.send(request, stream=True)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": [
                        (k.encode("latin-1"), v.encode("latin-1"))
                        for k, v in response.headers.multi_items()
                        if k.lower()
                        not in ("content-length", "transfer-encoding", "content-encoding")
                    ],
                }
            )
            chunks: AsyncIterator[bytes] = response.aiter_raw()
            with contextlib.suppress(httpx.HTTPError):  # a stream the server closed midway
                async for chunk in chunks:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()

    return app


@contextlib.contextmanager
def serve_in_thread(app: Any, port: int) -> Iterator[None]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise SystemExit("the bearer proxy did not start")
        time.sleep(0.05)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=10)


_LINE = re.compile(r"^\s*([✓✗])\s+([\w./-]+)")

# The suite's entry point in tests/conformance/node_modules (``npm ci``).
SUITE_BIN = HERE / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"


@functools.cache
def suite() -> list[str]:
    """The command that runs the suite: ``NODE``'s executable (resolved once through npx)
    on the installed suite, so each run starts one Node, not npx, its ``node`` package's
    launcher and then Node (about 0.6 s of CPU a run); ``npx ... conformance`` where that
    cannot be resolved."""
    via_npx = ["npx", "-y", "-p", NODE, "--", "conformance"]
    if not SUITE_BIN.is_file():
        return via_npx
    found = subprocess.run(
        ["npx", "-y", "-p", NODE, "--", "node", "-p", "process.execPath"],
        cwd=HERE, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    node = found.stdout.strip()
    return [node, str(SUITE_BIN)] if found.returncode == 0 and Path(node).is_file() else via_npx


def run_suite(url: str, revision: str, out: Path) -> dict[str, bool]:
    """The required scenarios of ``revision`` and whether each passed."""
    return run_suite_all(url, revision, out)[0]


def run_suite_all(url: str, revision: str, out: Path) -> tuple[dict[str, bool], dict[str, bool]]:
    """The required scenarios of ``revision`` and whether each passed, and the same of the
    scenarios the suite runs without scoring them (the extensions' ``tasks-*`` among them)."""
    cmd = [*suite(), "server", "--url", url, "--requirements", revision]
    done = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=900)
    out.write_text(done.stdout + done.stderr)
    text = done.stdout
    summary, _, unscored = text.partition("=== SUMMARY ===")[2].partition("Not scored")
    skip = {m.group(2) for line in unscored.splitlines() if (m := _LINE.match(line))}
    results: dict[str, bool] = {}
    extra: dict[str, bool] = {}
    for line in summary.splitlines():
        m = _LINE.match(line)
        if m:
            (extra if m.group(2) in skip else results)[m.group(2)] = m.group(1) == "✓"
    if not results:
        raise SystemExit(f"the conformance suite printed no summary; see {out}")
    return results, extra


def scenario_cmd(url: str, revision: str, scenario: str) -> list[str]:
    """The suite's command for one scenario. An extension's (``tasks-*``) is not on the
    spec timeline: the suite runs it at its own wire (2026-07-28) without a version."""
    cmd = [*suite(), "server", "--url", url, "--scenario", scenario]
    return cmd if scenario in TASKS else [*cmd, "--spec-version", revision]


def run_one(url: str, revision: str, scenario: str, out: Path) -> bool:
    """One scenario again, alone: passed (the suite's exit status)."""
    cmd = scenario_cmd(url, revision, scenario)
    done = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=300)
    out.write_text(done.stdout + done.stderr)
    return done.returncode == 0


def settle(
    results: dict[str, bool], which: set[str], url: str, revision: str, work: Path, label: str
) -> None:
    """Run each of ``which`` once more on its own and keep that result: a scenario that
    failed on a loaded machine (its timing, not its checks) passes the second time; one
    that really fails fails twice. Each rerun is printed."""
    for scenario in sorted(which):
        out = work / f"rerun-{label}-{revision}-{scenario}.txt"
        results[scenario] = run_one(url, revision, scenario, out)
        verdict = "passed" if results[scenario] else "failed again"
        print(f"  rerun {label} {revision} {scenario}: {verdict}")


def quick(url: str, revisions: list[str], work: Path) -> int:
    """The ``QUICK`` scenarios through callgate, each printed; 1 when one fails twice."""
    failed = 0
    for rev in revisions:
        for scenario in QUICK[rev]:
            out = work / f"quick-{rev}-{scenario}.txt"
            ok = run_one(url, rev, scenario, out) or run_one(url, rev, scenario, out)
            print(f"MCP conformance {rev} {scenario} through callgate: {'pass' if ok else 'FAIL'}")
            if not ok:
                failed += 1
                print(out.read_text()[-3000:])
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--revision", action="append", choices=REVISIONS)
    parser.add_argument("--keep", type=Path, help="a folder for logs and suite outputs")
    parser.add_argument("--scenario", help="run one scenario through callgate, printing its checks")
    parser.add_argument("--quick", action="store_true", help="the QUICK scenarios through callgate")
    ns = parser.parse_args()
    revisions = ns.revision or list(REVISIONS)
    with tempfile.TemporaryDirectory() as tmp:
        work = ns.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "CALLGATE_DEV": "1"}
        up_port, cg_port, proxy_port = free_port(), free_port(), free_port()
        upstream = [sys.executable, "-P", str(HERE / "upstream.py"), "--port", str(up_port)]
        state = work / "state"
        state.mkdir(exist_ok=True)
        profile = write_profile(work, f"http://127.0.0.1:{up_port}/mcp")
        token = session_token(state, profile)
        gateway = [str(CALLGATE), "--state-dir", str(state), "--profile", str(profile)]
        gateway += ["mcp", "--http", f"127.0.0.1:{cg_port}"]
        alone: dict[str, dict[str, bool]] = {}
        tasks: dict[str, bool] = {}
        through: dict[str, dict[str, bool]] = {}
        with process(upstream, up_port, work / "upstream.log", env):
            for rev in revisions if not (ns.scenario or ns.quick) else ():
                url = f"http://127.0.0.1:{up_port}/mcp"
                alone[rev] = run_suite(url, rev, work / f"alone-{rev}.txt")
                settle(alone[rev], {s for s, ok in alone[rev].items() if not ok}, url, rev,
                       work, "alone")  # fmt: skip
            with (
                process(gateway, cg_port, work / "callgate.log", env),
                serve_in_thread(bearer_proxy(f"http://127.0.0.1:{cg_port}", token), proxy_port),
            ):
                if ns.quick:
                    return quick(f"http://127.0.0.1:{proxy_port}/mcp", revisions, work)
                if ns.scenario:
                    url = f"http://127.0.0.1:{proxy_port}/mcp"
                    cmd = scenario_cmd(url, revisions[0], ns.scenario)
                    return subprocess.run(cmd, cwd=HERE, check=False).returncode
                for rev in revisions:
                    url = f"http://127.0.0.1:{proxy_port}/mcp"
                    through[rev], unscored = run_suite_all(url, rev, work / f"callgate-{rev}.txt")
                    if rev == "2026-07-28":  # the extension's scenarios run at its wire
                        tasks = {s: unscored.get(s, False) for s in TASKS}
                        again = {s for s, ok in tasks.items() if not ok and s not in TASKS_LOST}
                        settle(tasks, again, url, rev, work, "through callgate")
                    unexpected = {
                        s for s, ok in through[rev].items()
                        if not ok and alone[rev].get(s) and s not in KNOWN_LOST[rev]
                    }  # fmt: skip
                    settle(through[rev], unexpected, url, rev, work, "through callgate")
    status = 0
    if tasks:
        failed = sorted(s for s, ok in tasks.items() if not ok)
        print(
            f"MCP conformance tasks-* (2026-07-28, extension): through callgate "
            f"{sum(tasks.values())}/{len(tasks)} scenarios pass"
        )
        if failed:
            print(f"  fail through callgate: {', '.join(failed)}")
        if set(failed) != TASKS_LOST:
            status = 1
            new = sorted(set(failed) - TASKS_LOST)
            fixed = sorted(TASKS_LOST - set(failed))
            print(f"  not the known exceptions: newly failing {new}, now passing {fixed}")
    for rev in revisions:
        a, t = alone[rev], through[rev]
        lost = sorted(s for s, ok in a.items() if ok and not t.get(s, False))
        print(
            f"MCP conformance {rev}: upstream alone {sum(a.values())}/{len(a)} required "
            f"scenarios pass; through callgate {sum(t.values())}/{len(t)}"
        )
        if lost:
            print(f"  pass alone, fail through callgate: {', '.join(lost)}")
        if set(lost) != KNOWN_LOST[rev]:
            status = 1
            new = sorted(set(lost) - KNOWN_LOST[rev])
            fixed = sorted(KNOWN_LOST[rev] - set(lost))
            print(f"  not the known exceptions: newly lost {new}, now passing {fixed}")
    return status


if __name__ == "__main__":
    sys.exit(main())
