"""The same service scenarios against Apache Kafka (KRaft) in Docker, via testcontainers.

tansu stands in for Kafka everywhere else; this module checks that nothing depends on its
quirks (docs/contract.md "Backends"): ``callgate serve`` on a real Apache Kafka broker runs the
lifecycle, V1 and V2 scenarios of ``tests.kafka_support``. Where no Docker engine answers,
the module is skipped and the reason printed.

The broker is a single node, so its transaction-state and offsets topics get replication
factor 1 (Kafka's default of 3 would never let ``init_transactions`` complete).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.kafka_support import (
    Deployment,
    KafkaServe,
    lifecycle_scenario,
    unique_prefix,
    v1_scenario,
    v2_scenario,
)

from callgate.surfaces.sdk import Gateway

pytestmark = [pytest.mark.kafka, pytest.mark.docker]

KAFKA_IMAGE = "confluentinc/cp-kafka:7.6.0"


def docker_unavailable() -> str | None:
    """Why no Docker engine can be used here, or None when one answers ``docker info``."""
    configured = os.environ.get("DOCKER_HOST")
    host = configured or "unix:///var/run/docker.sock"
    socket = host.removeprefix("unix://") if host.startswith("unix://") else None
    if socket is not None and not Path(socket).exists():
        where = "DOCKER_HOST names" if configured else "DOCKER_HOST is unset and the default"
        return f"no Docker engine: {where} socket {socket} does not exist"
    docker = shutil.which("docker")
    if docker is None:
        return f"no docker CLI on PATH to ask the engine at {host}"
    try:
        info = subprocess.run(
            [docker, "info", "--format", "{{.ServerVersion}}"],
            capture_output=True, text=True, timeout=20, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"no Docker engine: `docker info` did not answer within 20 s ({host})"
    if info.returncode != 0:
        detail = (info.stderr or info.stdout).strip().splitlines()
        return f"no Docker engine: `docker info` exited {info.returncode}: {detail[:1]}"
    return None


def kafka_container() -> Any:
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:  # older testcontainers
        from testcontainers.kafka import KafkaContainer
    container = KafkaContainer(KAFKA_IMAGE).with_kraft()
    container.with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
    container.with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
    return container


@pytest.fixture(scope="module")
def apache_kafka() -> Iterator[str]:
    """``host:port`` of an Apache Kafka broker in Docker; skips, printing why, without."""
    reason = docker_unavailable()
    if reason is not None:
        reason = f"Apache Kafka tests skipped: {reason}"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    with kafka_container() as kafka:
        yield kafka.get_bootstrap_server()


@pytest.fixture(scope="module")
def dep(apache_kafka: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("apache-kafka")
    deployment = Deployment(apache_kafka, unique_prefix("apache"), root / "state")
    server = KafkaServe(deployment, root / "serve.log")
    try:
        server.wait_ready(timeout_s=180)
        yield deployment
    finally:
        code = server.stop()
    assert code == 0, server.log.read_text()


@pytest.fixture(scope="module")
def gate(dep: Deployment) -> Iterator[Gateway]:
    gateway = dep.connect()
    yield gateway
    gateway.close()


def test_lifecycle_on_apache_kafka(dep: Deployment, gate: Gateway) -> None:
    """C2, C4, C5, C8, C9, C11 on Apache Kafka (``lifecycle_scenario``)."""
    lifecycle_scenario(dep, gate)


def test_v1_on_apache_kafka(dep: Deployment, gate: Gateway) -> None:
    """V1 / C6 on Apache Kafka."""
    v1_scenario(dep, gate)


def test_v2_on_apache_kafka(dep: Deployment, gate: Gateway) -> None:
    """V2 / C8, C11 on Apache Kafka; ``read_committed`` hides aborted records there, so
    every decision appears once on the log."""
    v2_scenario(dep, gate)
    seen = [e.event_id for _, e in dep.events() if e.event_type == "PolicyDecided"]
    assert len(seen) == len(set(seen)), "a decision appears twice on Apache Kafka"
