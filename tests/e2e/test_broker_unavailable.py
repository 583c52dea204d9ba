"""Failing well on Kafka (docs/contract.md, "Command line"): with no broker answering, every
command ends within ``--timeout`` with the coded error ``broker_unavailable`` naming the
bootstrap servers (exit 1), and librdkafka's own log lines never reach stderr unless
``-v`` asks for them. ``serve`` retries with one line per attempt and stops on SIGTERM.

Two ways a broker is missing: nothing ever listened on the port, and a real broker
(Apache Kafka) that answered and then stopped.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import EXIT_FAILED, EXIT_MISUSE, callgate_argv, cli_env, run, session
from tests.kafka_support import librdkafka_lines, require_broker

pytestmark = pytest.mark.e2e

TIMEOUT_S = 3
# Where nothing listens a command waits out its whole --timeout (librdkafka keeps retrying
# the refused connection), so those tests take the shortest whole second: what they check
# (the coded error within the timeout, named in the message) holds at any timeout. A
# broker that answers (the Kafka tier's tests) keeps TIMEOUT_S, room for a loaded machine.
NO_BROKER_TIMEOUT_S = 1
# Python start-up and the command's own work beyond --timeout: seconds on a 2-core machine,
# 16 s seen at a load average of 25. Without the probe a command waits out librdkafka's
# message.timeout.ms (300 s), so a bound of a minute still tells the two apart.
SLACK_S = 60.0


def no_librdkafka_lines(stderr: str) -> None:
    found = librdkafka_lines(stderr)
    assert not found, f"librdkafka lines reached stderr: {found[:5]}"


def kafka_args(bootstrap: str, timeout_s: int = TIMEOUT_S) -> list[str]:
    return ["--backend", "kafka", "--bootstrap-servers", bootstrap, "--timeout", str(timeout_s)]


@pytest.fixture
def nothing_listening() -> str:
    """A loopback port that nothing listens on."""
    from tools.ports import free_port

    return f"127.0.0.1:{free_port()}"


@pytest.fixture
def stopped_broker() -> Iterator[str]:
    """The address of an Apache Kafka broker that answered metadata, then was stopped."""
    from tools.apache_kafka import ApacheKafka

    from callgate.adapters.kafka.client import probe

    require_broker()
    broker = ApacheKafka().start()
    bootstrap = broker.bootstrap
    probe(bootstrap, 10)  # it did answer
    broker.stop()
    yield bootstrap


@pytest.mark.parametrize(
    "command",
    [
        ["propose", "--tool", "tickets.read", "--args", '{"ticket_id": "T-1"}'],
        ["pending"],
        ["status", "some-invocation"],
        ["audit", "verify"],
        ["replay"],
    ],
    ids=lambda c: c[0] if c[0] != "audit" else "audit-verify",
)
def test_no_broker_at_all_is_broker_unavailable_within_the_timeout(
    tmp_path: Path, nothing_listening: str, command: list[str]
) -> None:
    state = tmp_path / "state"
    token = session(state, "alice", "acme", "support")
    reads = ("propose", "pending", "status")  # these take the caller's session
    argv = [*command, "--session", token] if command[0] in reads else command
    started = time.monotonic()
    timeout = kafka_args(nothing_listening, NO_BROKER_TIMEOUT_S)
    result = run(state, *timeout, *argv, rc=EXIT_FAILED)
    elapsed = time.monotonic() - started
    assert elapsed < NO_BROKER_TIMEOUT_S + SLACK_S, f"took {elapsed:.1f}s: {result}"
    error = result.value["error"]
    assert error["code"] == "broker_unavailable", result
    within = f"within {NO_BROKER_TIMEOUT_S}s"
    assert nothing_listening in error["message"] and within in error["message"]
    no_librdkafka_lines(result.stderr)
    assert result.stderr == ""


@pytest.mark.kafka
def test_a_stopped_broker_is_broker_unavailable_and_quiet(
    tmp_path: Path, stopped_broker: str
) -> None:
    """The broker answered, then stopped: ``propose`` ends within its timeout with the coded
    error naming the servers, in JSON and in human form, and no librdkafka line."""
    state = tmp_path / "state"
    token = session(state, "alice", "acme", "support")
    argv = ["propose", "--session", token, "--tool", "tickets.read", "--args", "{}"]
    started = time.monotonic()
    coded = run(state, *kafka_args(stopped_broker), *argv, rc=EXIT_FAILED)
    assert time.monotonic() - started < TIMEOUT_S + SLACK_S, coded
    assert coded.value["error"]["code"] == "broker_unavailable", coded
    assert stopped_broker in coded.value["error"]["message"]
    no_librdkafka_lines(coded.stderr)

    human = run(state, *kafka_args(stopped_broker), *argv, rc=EXIT_FAILED, json_mode=False)
    assert human.stdout == ""
    [line] = human.stderr.splitlines()
    assert line.startswith("callgate: broker_unavailable: ") and stopped_broker in line


def test_verbose_shows_librdkafka_lines_through_python_logging(
    tmp_path: Path, nothing_listening: str
) -> None:
    """``-v``: librdkafka's lines are shown, as log records of ``callgate.librdkafka``."""
    state = tmp_path / "state"
    argv = ["pending", "--session", "a-token"]
    timeout = kafka_args(nothing_listening, NO_BROKER_TIMEOUT_S)
    result = run(state, "-v", *timeout, *argv, rc=EXIT_FAILED)
    assert result.value["error"]["code"] == "broker_unavailable"
    lines = result.stderr.splitlines()
    assert lines and all("callgate.librdkafka" in line for line in lines), lines[:5]


def test_serve_retries_with_one_line_per_attempt_then_stops(
    tmp_path: Path, nothing_listening: str
) -> None:
    """``serve`` with no broker: one JSON line per attempt naming the servers, no
    librdkafka line, and on SIGTERM a line that it stopped and exit 0."""
    argv = [
        *callgate_argv(), "--state-dir", str(tmp_path / "state"), "--log-format", "json",
        "--backend", "kafka", "--bootstrap-servers", nothing_listening, "--timeout", "1",
        "serve",
    ]  # fmt: skip
    log = tmp_path / "serve.err"
    with log.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=cli_env())
        try:
            deadline = time.monotonic() + 30
            while log.read_text().count("\n") < 2:
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
    assert code == 0, log.read_text()
    assert proc.stdout is not None and proc.stdout.read() == b""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    attempts = [line for line in lines if line["event"] == "broker_unavailable"]
    assert [a["attempt"] for a in attempts] == list(range(1, len(attempts) + 1))
    assert len(attempts) >= 2
    assert all(nothing_listening in a["message"] for a in attempts)
    assert lines[-1]["event"] == "stopped"
    no_librdkafka_lines(log.read_text())


@pytest.mark.kafka
def test_a_broker_without_the_deployments_topics_is_not_found(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """The broker answers but no ``callgate serve`` created topics under this prefix: the
    command says so at once (``not_found`` naming the topic), instead of waiting for
    records nobody will read."""
    state = tmp_path / "state"
    token = session(state, "alice", "acme", "support")
    argv = ["propose", "--session", token, "--tool", "tickets.read", "--args", "{}"]
    prefix = f"t-undeployed-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    result = run(
        state, *kafka_args(kafka_bootstrap), *argv, rc=EXIT_FAILED,
        env={"CALLGATE_TOPIC_PREFIX": prefix},
    )  # fmt: skip
    assert time.monotonic() - started < TIMEOUT_S + SLACK_S, result
    error = result.value["error"]
    assert error["code"] == "not_found" and f"{prefix}.requests" in error["message"], result
    no_librdkafka_lines(result.stderr)


@pytest.mark.parametrize(
    "item", ["isolation.level=read_uncommitted", "enable.auto.commit=true", "garbage"]
)
def test_serve_refuses_consumer_overrides_that_are_not_tuning(
    tmp_path: Path, nothing_listening: str, item: str
) -> None:
    """``CALLGATE_KAFKA_CONSUMER`` tunes group membership and fetching only: an override of
    isolation or commits (what C8, C9 and C12 rest on), or a malformed item, stops serve at
    start with ``usage``, before any child could be restarted forever."""
    result = run(
        tmp_path / "state",
        *kafka_args(nothing_listening),
        "serve",
        rc=EXIT_MISUSE,
        env={"CALLGATE_KAFKA_CONSUMER": f"session.timeout.ms=6000,{item}"},
    )
    error = result.value["error"]
    assert error["code"] == "usage" and repr(item) in error["message"], result
