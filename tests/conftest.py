"""Shared fixtures: the Kafka-protocol brokers the ``kafka`` tests run against.

Every test that takes ``kafka_bootstrap`` (or ``kafka_broker``) runs once per broker:
``tansu`` (the in-memory stand-in shipped in a wheel) and ``apache`` (Apache Kafka from
Maven, ``callgate.ops.apache_kafka``). Each broker is started once per test session and
stopped at its end; tests keep apart by topic prefix. ``CALLGATE_TEST_BROKERS`` (e.g.
``apache``) limits the brokers; where a broker cannot start, its tests skip with the reason
printed, unless ``CALLGATE_REQUIRE_APACHE_KAFKA=1`` (CI, ``make test-kafka``), which turns
Apache Kafka's skip into a failure.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from callgate.adapters.kafka.tansu import TansuBroker
from callgate.ops.apache_kafka import ApacheKafka
from tests.kafka_support import Broker, require_broker, selected_brokers


@pytest.fixture(scope="session", params=selected_brokers())
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    """A broker of the parametrized kind, started for this test session."""
    kind = str(request.param)
    require_broker(kind)
    server = TansuBroker() if kind == "tansu" else ApacheKafka()
    with server:
        yield Broker(kind, server.bootstrap)
        # Destroy clients the tests dropped while the broker still answers, so their
        # background threads do not log connection failures after the run's summary.
        gc.collect()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: Broker) -> str:
    """``host:port`` of the parametrized broker."""
    return kafka_broker.bootstrap
