"""Issue 12: a deployment on a broker that requires authentication (SASL), configured only
through ``callgate.toml``'s ``[kafka_client]`` table.

An Apache Kafka broker of its own listens with ``SASL_PLAINTEXT`` (PLAIN) and lets in only
its accounts. ``callgate serve`` (its six children), and the command-line clients reach it
with the configured credentials: the read executes end to end, so every client on the path
authenticated. Without the table, or with a wrong password, a command ends in
``broker_unavailable`` naming the servers, never in a hang or a traceback.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.kafka_support import (
    Deployment,
    KafkaServe,
    cli,
    cli_propose,
    cli_session,
    require_broker,
)
from tools.apache_kafka import ApacheKafka

from callgate.adapters.kafka.connection import use_connection

pytestmark = pytest.mark.kafka

PASSWORD = f"pw-{uuid.uuid4().hex[:12]}"


def kafka_client_table(password: str) -> str:
    return (
        "[kafka_client]\n"
        '"security.protocol" = "SASL_PLAINTEXT"\n'
        '"sasl.mechanism" = "PLAIN"\n'
        '"sasl.username" = "callgate"\n'
        f'"sasl.password" = "{password}"\n'
    )


@pytest.fixture(scope="module")
def sasl_broker() -> Iterator[ApacheKafka]:
    require_broker()
    with ApacheKafka(sasl_users={"callgate": PASSWORD}) as kafka:
        yield kafka


def deployment(tmp: Path, broker: ApacheKafka, table: str | None) -> Deployment:
    config = None
    if table is not None:
        config = tmp / "callgate.toml"
        config.write_text(table)
    return Deployment(
        bootstrap=broker.sasl_bootstrap,
        prefix=f"t-sasl-{uuid.uuid4().hex[:8]}",
        state_dir=tmp / "state",
        config=config,
    )


def test_serve_and_clients_authenticate_with_the_configured_credentials(
    sasl_broker: ApacheKafka, tmp_path: Path
) -> None:
    dep = deployment(tmp_path, sasl_broker, kafka_client_table(PASSWORD))
    serve = KafkaServe(dep, tmp_path / "serve.log")
    try:
        serve.wait_ready()
        alice = cli_session(dep, "alice", "acme", "support")
        answer = cli_propose(dep, alice, "tickets.read", {"ticket_id": "T-77"})
        assert answer["outcome"] == "executed", answer
        assert cli(dep, "audit", "verify").value["ok"] is True
    finally:
        use_connection({})  # wait_ready's in-process client wired this test process
        assert serve.stop() == 0, serve.log.read_text()
    assert PASSWORD not in serve.log.read_text()  # the password is never logged


@pytest.mark.parametrize("password", [None, "wrong"], ids=["no-credentials", "wrong-password"])
def test_a_client_without_the_right_credentials_is_told_the_broker_is_unavailable(
    sasl_broker: ApacheKafka, tmp_path: Path, password: str | None
) -> None:
    table = None if password is None else kafka_client_table(password)
    dep = deployment(tmp_path, sasl_broker, table)
    run = cli(dep, "--timeout", "5", "audit", "verify", rc=None)
    assert run.returncode != 0, run
    error = run.value["error"]
    assert error["code"] == "broker_unavailable", run
    assert sasl_broker.sasl_bootstrap in error["message"]
    if password is not None:  # the broker's refusal is the reason given
        assert "SASL authentication error" in error["message"], run
