"""The Apache Kafka launcher's pure parts: one version everywhere, a valid cluster id, and
the single-node settings a transactional test broker needs (ADR 0015)."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import yaml
from tools.apache_kafka import KAFKA_VERSION, POM, broker_properties, cluster_id

REPO = Path(__file__).resolve().parents[2]


def test_docker_compose_runs_the_kafka_version_of_the_suite() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert compose["services"]["kafka"]["image"] == f"apache/kafka:{KAFKA_VERSION}"
    assert f"<version>{KAFKA_VERSION}</version>" in POM.format(kafka=KAFKA_VERSION, log4j="x")


def test_cluster_ids_are_kafka_uuids() -> None:
    ids = {cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for value in ids:
        assert re.fullmatch(r"[A-Za-z0-9_-]{22}", value)
        assert len(base64.urlsafe_b64decode(value + "==")) == 16


def test_single_node_settings(tmp_path: Path) -> None:
    props = broker_properties(9092, 9093, tmp_path)
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    assert props["listeners"].startswith("PLAINTEXT://127.0.0.1:9092,")
    for name in ("offsets.topic", "transaction.state.log"):
        assert props[f"{name}.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert int(props["group.min.session.timeout.ms"]) <= 6000  # the tests' session timeout
