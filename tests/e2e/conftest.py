"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kafka_support import Broker, Deployment, KafkaServe, Pair, unique_prefix


@pytest.fixture
def pair(kafka_broker: Broker, tmp_path: Path) -> Iterator[Pair]:
    dep = Deployment(kafka_broker.bootstrap, unique_prefix("instances"), tmp_path / "state")
    a = KafkaServe(dep, tmp_path / "a.log", instance_id="a")
    b = KafkaServe(dep, tmp_path / "b.log", instance_id="b")
    try:
        a.wait_ready()
        b.wait_ready()
        yield dep, a, b
    finally:
        b.stop()
        code = a.stop()
    assert code == 0, a.log.read_text()
