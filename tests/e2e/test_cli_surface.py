"""The command line as people and scripts meet it (docs/contract.md, "Command line").

Start-up loads only what ``--help`` needs; every global option documents its default and
environment variable; ``session issue`` prints a bare token for ``$(...)``; with ``--json``
every error is one JSON value (misuse as code ``usage``, exit 2), bad environment values
included; human output prints ISO-8601 UTC times and fits 80 columns without cutting a
tool name; ``serve`` prints a line per settled decision and one when it stops.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from callgate import gc_settings
from callgate.surfaces.cli import build_parser
from tests.e2e.helpers import (
    EXIT_FAILED,
    EXIT_MISUSE,
    EXIT_OK,
    Run,
    callgate_argv,
    cg,
    cli_env,
    propose,
    session,
)

pytestmark = pytest.mark.e2e

ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
HEAVY = (
    "pydantic", "rich", "confluent_kafka", "cedarpy", "jsonschema", "fastavro", "jwt",
    "cryptography", "prometheus_client", "opentelemetry", "icu", "yaml", "httpx",
)  # fmt: skip
# What ``callgate propose`` does not load as a client of a running server: the policy
# engine, token handling, metrics, tracing, HTTP clients, and the processes themselves.
NOT_FOR_PROPOSE = (
    "cedarpy", "jwt", "icu", "prometheus_client", "opentelemetry", "httpx", "confluent_kafka",
    "callgate.decider", "callgate.executor", "callgate.providers", "callgate_projections",
)  # fmt: skip
BIG_REFUND = {"order_id": "ORD-77", "amount_cents": 25000, "currency": "EUR"}


def call(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, columns: int = 200
) -> Run:
    """The installed ``callgate ARGS`` with ``env`` added to a clean environment."""
    argv = [*callgate_argv(), *args]
    full_env = {**cli_env(), "COLUMNS": str(columns), **(env or {})}
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=60, check=False
    )
    result = Run(argv, proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in result.stderr, result
    return result


def fits_80(line: str) -> bool:
    """At most 80 columns, except that an unbreakable identifier (a signed approval id,
    a session-bound invocation id: for copy and paste) is printed whole: the rest of its
    line must fit."""
    tokens = [w for w in line.split() if len(w) > 40 and "." in w]
    rest = line
    for token in tokens:
        rest = rest.replace(token, "")
    return len(rest) <= 80


def test_help_loads_no_heavy_module() -> None:
    """``callgate --help`` imports the parser only: no pydantic, rich, Kafka client, policy
    engine, JSON Schema, Avro, JWT, cryptography, metrics or tracing (these made start-up
    about 0.5 s), nor the event classes (40 dataclasses, ~40 ms). A start-up guard that
    times nothing: it fails when someone adds such an import to the parser's path."""
    probe = (
        "import sys\n"
        "from callgate.surfaces.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))\n"
        "print('callgate.domain.events' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip().splitlines()[-2:] == ["[]", "False"], out[-500:]


def test_propose_to_a_running_server_loads_neither_the_engine_nor_the_processes(
    tmp_path: Path,
) -> None:
    """``callgate propose`` while a server holds the runner lock appends and polls: it
    imports no policy engine, JWT, ICU, metrics, tracing or HTTP client, and none of the
    processes (ADR 0089). The server is stood for by holding ``runner.lock``, so the call
    times out undecided; what is checked is what the process loaded on the way."""
    state = tmp_path / "state"
    env = {**cli_env(), "CALLGATE_STATE_DIR": str(state), "CALLGATE_DEV": "1"}
    issued = call("session", "issue", "--user", "alice", "--tenant", "acme", env=env)
    token = issued.stdout.strip()
    probe = (
        "import fcntl, os, sys\n"
        "fd = os.open(os.path.join(sys.argv[1], 'runner.lock'), os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)  # the running server\n"
        "from callgate.surfaces.cli import main\n"
        "main(['propose', '--session', sys.argv[2], '--tool', 'tickets.read',\n"
        "      '--args', '{\"ticket_id\": \"T-1\"}', '--timeout', '0.3'])\n"
        f"names = {NOT_FOR_PROPOSE!r}\n"
        "print(sorted(n for n in names if any(m == n or m.startswith(n + '.') "
        "for m in sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(state), token],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert "pending_decision" in done.stdout, done  # published, and nobody decided it
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-500:]


def test_the_command_line_sets_the_collector_thresholds_of_its_process() -> None:
    """Every ``callgate`` command runs with callgate's collector thresholds
    (``callgate.gc_settings``), not CPython's default young generation of 700."""
    probe = (
        "import gc\n"
        "from callgate.surfaces.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(gc.get_threshold())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    expected = (
        gc_settings.YOUNG_THRESHOLD,
        gc_settings.MIDDLE_THRESHOLD,
        gc_settings.OLD_THRESHOLD,
    )
    assert out.strip().splitlines()[-1] == str(expected)
    assert expected != (700, 10, 10)


def test_every_global_option_names_its_default_and_environment_variable() -> None:
    parser = build_parser()
    options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in options} >= {
        "json", "state_dir", "backend", "bootstrap_servers", "profile", "timeout",
        "log_format", "verbose",
    }  # fmt: skip
    for action in options:
        text = action.help or ""
        assert "default" in text, (action.option_strings, text)
        if action.dest != "json":  # a script asks for JSON where it parses it
            assert "env CALLGATE_" in text, (action.option_strings, text)


def test_session_issue_prints_a_bare_token_usable_in_command_substitution(
    tmp_path: Path,
) -> None:
    """Plain output is the token and a newline, never wrapped (even at 20 columns);
    ``--json`` gives ``{"token"}``; the token works as ``--session``."""
    state = str(tmp_path / "state")
    issue = ["--state-dir", state, "session", "issue", "--user", "alice", "--tenant", "acme"]
    plain = call(*issue, "--roles", "support", columns=20)
    assert plain.returncode == EXIT_OK and plain.stderr == ""
    token = plain.stdout.removesuffix("\n")
    assert token and "\n" not in token and " " not in token and len(token) > 20
    coded = call("--json", *issue, columns=20)
    assert list(json.loads(coded.stdout)) == ["token"]
    answer = propose(tmp_path / "state", token, "tickets.read", {"ticket_id": "T-1"})
    assert answer["outcome"] == "executed"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"CALLGATE_BACKEND": "foo"}, "CALLGATE_BACKEND"),
        ({"CALLGATE_PARTITIONS": "x"}, "CALLGATE_PARTITIONS"),
        ({"CALLGATE_PARTITIONS": "0"}, "CALLGATE_PARTITIONS"),
        ({"CALLGATE_TIMEOUT": "soon"}, "CALLGATE_TIMEOUT"),
        ({"CALLGATE_FAULTS": "[1]"}, "CALLGATE_FAULTS"),
        ({"CALLGATE_LOG_FORMAT": "xml"}, "CALLGATE_LOG_FORMAT"),
    ],
)
def test_a_bad_environment_value_is_misuse_not_an_internal_error(
    tmp_path: Path, env: dict[str, str], named: str
) -> None:
    env = {**env, "CALLGATE_STATE_DIR": str(tmp_path / "state")}
    coded = call("--json", "catalog", env=env)
    assert coded.returncode == EXIT_MISUSE, coded
    error = json.loads(coded.stdout)["error"]
    assert error["code"] == "usage" and named in error["message"], error
    human = call("catalog", env=env)
    assert human.returncode == EXIT_MISUSE and human.stdout == ""
    assert human.stderr.startswith("callgate: error: ") and named in human.stderr


def test_with_json_every_error_is_one_json_value(tmp_path: Path) -> None:
    """A failed command (exit 1) and misuse (exit 2) alike: ``{"error": {"code",
    "message"}}`` on stdout, nothing on stderr."""
    state = str(tmp_path / "state")
    alice = session(tmp_path / "state", "alice", "acme", "support")
    for argv, rc, code in [
        (["status", "no-such-invocation", "--session", alice], EXIT_FAILED, "not_found"),
        (["approve", "no-such-invocation", "--session", "x"], EXIT_FAILED, "not_pending"),
        (["frobnicate"], EXIT_MISUSE, "usage"),
        (["propose", "--session", "x", "--tool", "t", "--args", "[]"], EXIT_MISUSE, "usage"),
        (["--timeout", "never", "catalog"], EXIT_MISUSE, "usage"),
        (["bench"], EXIT_MISUSE, "usage"),  # a developer tool: python -m tools bench
    ]:
        result = call("--json", "--state-dir", state, *argv)
        assert result.returncode == rc, result
        value = json.loads(result.stdout)
        assert list(value) == ["error"] and set(value["error"]) == {"code", "message"}, value
        assert value["error"]["code"] == code, result
        assert result.stderr == "", result


def test_human_output_fits_80_columns_with_iso_times_and_whole_tool_names(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    alice = session(state, "alice", "acme", "support")
    bob = session(state, "bob", "acme", "finance-approver")
    first = propose(state, alice, "refunds.issue", BIG_REFUND, key="r-1")
    assert first["outcome"] == "approval_required"
    propose(state, alice, "tickets.create", {"title": "x", "requester_id": "alice"}, key="t-1")
    tools = [t["name"] for t in cg(state, "catalog")]
    outputs: dict[str, str] = {}
    for name, argv in [
        ("catalog", ["catalog"]),
        ("pending", ["pending", "--session", bob]),
        ("approve", ["approve", first["invocation_id"], "--session", bob]),
        ("status", ["status", first["invocation_id"], "--session", alice]),
        ("audit", ["audit", "--session", alice]),
        ("effects", ["effects"]),
    ]:
        result = call("--state-dir", str(state), *argv, columns=80)
        assert result.returncode == EXIT_OK, result
        wide = [line for line in result.stdout.splitlines() if not fits_80(line)]
        assert not wide, (name, wide)
        assert not re.search(r"\b1\d{12}\b", result.stdout), (name, "epoch ms in human output")
        outputs[name] = result.stdout
    catalog_words = set(outputs["catalog"].split())
    assert all(tool in catalog_words for tool in tools), outputs["catalog"]
    assert "refunds.issue" in outputs["pending"].split()
    for name in ("pending", "approve", "status"):
        assert ISO_UTC.search(outputs[name]), (name, outputs[name])


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_serve_prints_a_line_per_settled_decision_and_when_it_stops(
    tmp_path: Path, log_format: str
) -> None:
    state = tmp_path / "state"
    alice = session(state, "alice", "acme", "support")
    log = tmp_path / "serve.err"
    argv = [*callgate_argv(), "--state-dir", str(state), "--log-format", log_format, "serve"]
    with log.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=cli_env())
        try:
            deadline = time.monotonic() + 30
            while "callgate serve" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            read = propose(state, alice, "tickets.read", {"ticket_id": "T-1"})
            spoof = propose(state, alice, "tickets.create", {"title": "x", "requester_id": "bob"})
            while log.read_text().count(spoof["invocation_id"]) < 1:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
    assert code == 0, log.read_text()
    text = log.read_text()
    decided = [(read["invocation_id"], "tickets.read", "executed")]
    decided += [(spoof["invocation_id"], "tickets.create", "identity_spoof")]
    if log_format == "json":
        lines = [json.loads(line) for line in text.splitlines()]
        assert lines[0]["event"] == "started" and lines[-1]["event"] == "stopped"
        settled = [(x["invocation_id"], x["tool"], x["outcome"]) for x in lines[1:-1]]
        assert settled == decided, lines
        assert all(ISO_UTC.fullmatch(x["time"]) for x in lines)
    else:
        for inv, tool, outcome in decided:
            [line] = [x for x in text.splitlines() if inv in x]
            assert ISO_UTC.match(line) and tool in line.split() and outcome in line.split()
        last = text.splitlines()[-1]
        assert ISO_UTC.match(last) and "callgate serve stopped" in last
