"""Shared fixtures: a real Kafka-protocol broker (tansu, in-memory) for the ``kafka`` tests."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a tansu broker started for this test session (docs/contract.md "Backends").

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
        # Destroy clients the tests dropped while the broker still answers, so their
        # background threads do not log connection failures after the run's summary.
        gc.collect()
