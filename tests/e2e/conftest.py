"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_support import Broker, Deployment, KafkaServe, Pair, unique_prefix
from tests.mcp_support import Gate, MakeMcpGate, running_gate


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


@pytest.fixture
def make_mcp_gate(tmp_path: Path) -> Iterator[MakeMcpGate]:
    """Makes the test's MCP gate: ``make_mcp_gate(transport, edit=None, quiet=True)``, a
    fresh state directory and the notes profile, over ``stdio`` or ``http``
    (``tests.mcp_support.running_gate``); an ``http`` server stops after the test."""
    with contextlib.ExitStack() as stack:

        def make(
            transport: str,
            edit: Callable[[dict[str, Any]], None] | None = None,
            quiet: bool = True,
        ) -> Gate:
            return stack.enter_context(running_gate(tmp_path, transport, edit, quiet))

        yield make
