"""Shared fixtures: a real Kafka-protocol broker (tansu, in-memory) for the ``kafka`` tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a tansu broker started for this test session (DESIGN "Backends").

    Skips, printing the reason, only when no tansu binary is installed.
    """
    from callgate.adapters.kafka.tansu import BrokerUnavailable, TansuBroker, find_tansu

    try:
        find_tansu()
    except BrokerUnavailable as exc:
        reason = f"kafka tests skipped: {exc}"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    with TansuBroker() as broker:
        yield broker.bootstrap
