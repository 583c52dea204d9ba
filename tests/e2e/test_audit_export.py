"""``callgate audit export`` and ``audit verify --file``, end to end, on both backends.

The installed command writes the audit records as JSON lines (CloudEvents 1.0 structured
mode, or OCSF API Activity); the file verifies on its own; a tampered, removed or edited
line is found and named by its line number; a named exporter resumes from its stored
position, never skipping or repeating a record (also when the stored position is behind
the file, as after a crash between writing and storing); ``--follow`` writes records as
they settle until SIGTERM. The same scenario runs on the embedded store and on Kafka
(Apache Kafka, ``kafka_bootstrap``).
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import helpers
from tests.e2e.helpers import EXIT_FAILED, EXIT_MISUSE, Run, cli_env
from tests.kafka_support import PARTITIONS, Deployment, KafkaServe, unique_prefix

pytestmark = pytest.mark.e2e


@dataclass
class Surface:
    """The installed command on one backend: run a command, or start one (``--follow``)."""

    run: Callable[..., Run]
    argv: list[str]
    env: dict[str, str]
    state_dir: Path

    def value(self, *args: str, rc: int = 0) -> Any:
        return self.run(*args, rc=rc).value

    def session(self, user: str, tenant: str, roles: str) -> str:
        issued = self.value(
            "session", "issue", "--user", user, "--tenant", tenant, "--roles", roles
        )
        return str(issued["token"])

    def read(self, token: str, ticket: str) -> str:
        argv = helpers.propose_argv(token, "tickets.read", json.dumps({"ticket_id": ticket}))
        answer = self.value(*argv)
        assert answer["outcome"] == "executed", answer
        return str(answer["invocation_id"])


@pytest.fixture
def embedded(tmp_path: Path) -> Surface:
    state = tmp_path / "state"

    def run(*args: str, rc: int | None = 0) -> Run:
        return helpers.run(state, *args, rc=rc)

    argv = [*helpers.callgate_argv(), "--state-dir", str(state)]
    return Surface(run, argv, cli_env(), state)


@pytest.fixture(scope="module")
def kafka_dep(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("audit-export-kafka")
    deployment = Deployment(kafka_bootstrap, unique_prefix("export"), root / "state")
    server = KafkaServe(deployment, root / "serve.log", flags=True)
    try:
        server.wait_ready()
        yield deployment
    finally:
        code = server.stop()
    assert code == 0, server.log.read_text()


@pytest.fixture
def kafka(kafka_dep: Deployment) -> Surface:
    from tests.kafka_support import cli

    def run(*args: str, rc: int | None = 0) -> Run:
        return cli(kafka_dep, *args, rc=rc)

    argv = [
        *helpers.callgate_argv(), "--backend", "kafka",
        "--bootstrap-servers", kafka_dep.bootstrap, "--state-dir", str(kafka_dep.state_dir),
    ]  # fmt: skip
    env = {
        **cli_env(),
        "CALLGATE_TOPIC_PREFIX": kafka_dep.prefix,
        "CALLGATE_PARTITIONS": str(PARTITIONS),
    }
    return Surface(run, argv, env, kafka_dep.state_dir)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def export_ids(path: Path) -> list[str]:
    """The record key of every line (CloudEvents ``id``, OCSF ``metadata.uid``)."""
    out = []
    for line in lines(path):
        event = json.loads(line)
        out.append(event["id"] if "specversion" in event else event["metadata"]["uid"])
    return out


def wait_until(predicate: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def exported_invocations(path: Path) -> set[str]:
    if not path.exists():
        return set()
    found = set()
    for line in lines(path):
        event = json.loads(line)
        found.add(event["subject"] if "specversion" in event else event["api"]["request"]["uid"])
    return found


def scenario(cg: Surface, folder: Path) -> None:
    """The whole contract of the export on one backend (the module docstring)."""
    ops = cg.session("operator", "ops", "callgate-operator")
    alice = cg.session("alice", "acme", "support")
    first = {cg.read(alice, f"T-{n}") for n in range(3)}
    out = folder / "audit.jsonl"

    # A named exporter writes every record once; the file verifies on its own.
    summary = cg.value("audit", "export", "--session", ops, "--name", "siem", "--output", str(out))
    assert summary["exported"] == len(lines(out)) >= 3, summary
    assert first <= exported_invocations(out)
    event = json.loads(lines(out)[0])
    assert event["specversion"] == "1.0" and event["type"] == "io.callgate.audit.record"
    assert event["data"]["hash"] == event["callgatehash"] and event["data"]["seq"] >= 1
    assert cg.value("audit", "verify", "--file", str(out))["ok"] is True

    # Resumes: only what settled since; nothing repeated, nothing skipped.
    again = cg.value("audit", "export", "--session", ops, "--name", "siem", "--output", str(out))
    assert again["exported"] == 0
    second = {cg.read(alice, f"T-{n}") for n in range(3, 5)}
    more = cg.value("audit", "export", "--session", ops, "--name", "siem", "--output", str(out))
    assert more["exported"] >= 2
    ids = export_ids(out)
    assert len(ids) == len(set(ids))
    assert first | second <= exported_invocations(out)
    verified = cg.value("audit", "verify", "--file", str(out))
    assert verified["ok"] is True and verified["records"] == len(ids), verified
    assert verified["anchored"] == []  # every chain in the file starts at its first record
    assert verified["continues"] is False  # and its first line is the exporter's first

    # Every record of the views is in the file, exactly once.
    trail = cg.value("audit", "--session", ops)
    assert sorted(ids) == sorted(f"{r['partition_key']}:{r['seq']:012d}" for r in trail)

    # The stored position behind the file (a crash between writing and storing): the file's
    # own position wins, so nothing is written twice.
    position_file = cg.state_dir / "exporters" / "siem.json"
    behind = json.loads(position_file.read_text())
    third = cg.read(alice, "T-9")
    cg.value("audit", "export", "--session", ops, "--name", "siem", "--output", str(out))
    position_file.write_text(json.dumps(behind))  # as if that run had crashed before storing
    resumed = cg.value("audit", "export", "--session", ops, "--name", "siem", "--output", str(out))
    assert resumed["exported"] == 0 and third in exported_invocations(out)
    ids = export_ids(out)
    assert len(ids) == len(set(ids)), "a record was written twice"

    # A second exporter, to OCSF, from the same records; it verifies too.
    ocsf = folder / "audit.ocsf.jsonl"
    cg.value("audit", "export", "--session", ops, "--format", "ocsf", "--output", str(ocsf))
    events = [json.loads(line) for line in lines(ocsf)]
    assert {(e["class_uid"], e["category_uid"], e["type_uid"]) for e in events} == {
        (6003, 6, 600399)
    }
    [event] = [e for e in events if e["api"]["request"]["uid"] == third]
    assert event["actor"]["user"]["name"] == "alice" and event["metadata"]["tenant_uid"] == "acme"
    assert event["api"]["operation"] == "tickets.read" and event["status_code"] == "executed"
    assert cg.value("audit", "verify", "--file", str(ocsf))["ok"] is True

    # Tampering is found and named by its line number.
    original = lines(out)
    for label, edit in tamper_cases(original):
        bad = folder / f"tampered-{label}.jsonl"
        edited, line_no = edit()
        bad.write_text("\n".join(edited) + "\n")
        result = cg.run("audit", "verify", "--file", str(bad), rc=EXIT_FAILED).value
        assert result["ok"] is False and result["line"] == line_no, (label, result)

    # A tenant session may not export (a chain may hold records no tenant session owns).
    denied = cg.run("audit", "export", "--session", alice, rc=EXIT_FAILED).value
    assert denied["error"]["code"] == "operator_required"
    # --since only starts a new exporter.
    misuse = cg.run(
        "audit", "export", "--session", ops, "--name", "siem", "--since", "1h", rc=EXIT_MISUSE
    )
    assert "--since" in misuse.value["error"]["message"]

    # --since: a new exporter starts at records that occurred in that window. The window
    # reaches 3 s before the call (a slow command start-up), older records are 6 s older.
    time.sleep(6)
    before = time.monotonic()
    recent = cg.read(alice, "T-10")
    window = math.ceil(time.monotonic() - before) + 3
    windowed = folder / "recent.jsonl"
    cg.value(
        "audit", "export", "--session", ops, "--since", f"{window}s", "--output", str(windowed)
    )
    assert exported_invocations(windowed) == {recent}
    assert cg.value("audit", "verify", "--file", str(windowed))["ok"] is True

    follow(cg, ops, alice, folder)


def tamper_cases(original: list[str]) -> list[tuple[str, Callable[[], tuple[list[str], int]]]]:
    """Edits of an exported file and the line number the check must name."""
    middle = len(original) // 2

    def field_changed() -> tuple[list[str], int]:
        event = json.loads(original[middle])
        event["data"]["outcome"] = "tool_forbidden" if event["data"]["outcome"] else "executed"
        return [*original[:middle], json.dumps(event), *original[middle + 1 :]], middle + 1

    def envelope_changed() -> tuple[list[str], int]:
        event = json.loads(original[middle])
        event["time"] = "2001-01-01T00:00:00Z"
        return [*original[:middle], json.dumps(event), *original[middle + 1 :]], middle + 1

    def line_removed() -> tuple[list[str], int]:
        # The line after it no longer links to the line before it.
        return [*original[:middle], *original[middle + 1 :]], middle + 1

    def garbage() -> tuple[list[str], int]:
        return [*original[:middle], "{not json", *original[middle + 1 :]], middle + 1

    return [
        ("field", field_changed),
        ("envelope", envelope_changed),
        ("removed", line_removed),
        ("garbage", garbage),
    ]


def follow(cg: Surface, ops: str, alice: str, folder: Path) -> None:
    """``--follow`` writes each record as it settles, and stops cleanly on SIGTERM."""
    out = folder / "follow.jsonl"
    argv = [
        *cg.argv, "--json", "audit", "export", "--session", ops, "--name", "tail",
        "--follow", "--output", str(out),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, env=cg.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert wait_until(lambda: out.exists() and len(lines(out)) > 0)
        later = cg.read(alice, "T-20")
        assert wait_until(lambda: later in exported_invocations(out)), "not followed"
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert json.loads(stdout)["exported"] == len(lines(out))
    ids = export_ids(out)
    assert len(ids) == len(set(ids))
    assert cg.value("audit", "verify", "--file", str(out))["ok"] is True


def test_export_on_the_embedded_store(embedded: Surface, tmp_path: Path) -> None:
    """The export contract (module docstring) on the embedded store."""
    scenario(embedded, tmp_path)


@pytest.mark.kafka
def test_export_on_kafka(kafka: Surface, tmp_path: Path) -> None:
    """The export contract (module docstring) on Kafka, the views read from the broker."""
    scenario(kafka, tmp_path)
