"""Shared fixtures: the Kafka-protocol brokers the ``kafka`` tests run against.

Every test that takes ``kafka_bootstrap`` (or ``kafka_broker``) runs once per broker:
``tansu`` (the in-memory stand-in shipped in a wheel) and ``apache`` (Apache Kafka from
Maven, ``callgate.ops.apache_kafka``). Each broker is started once per test session and
stopped at its end; tests keep apart by topic prefix. ``CALLGATE_TEST_BROKERS`` (e.g.
``apache``) limits the brokers; where a broker cannot start, its tests skip with the reason
printed, unless ``CALLGATE_REQUIRE_APACHE_KAFKA=1`` (CI, ``make test-kafka``), which turns
Apache Kafka's skip into a failure.

``CALLGATE_CI=1`` (``.ci/run``) turns every skip into a failure: CI installs every real
dependency a test may skip for (Java and the Kafka jars, Chromium, uv), so a skip there
means a dependency went missing, not that it is absent by design.
"""

from __future__ import annotations

import gc
import os
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


CI_ENV = "CALLGATE_CI"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get(CI_ENV) == "1" and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"{CI_ENV}=1 allows no skip: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Iterator[None]:
    """A module skipped as a whole (``allow_module_level``) fails under ``CALLGATE_CI=1``."""
    outcome = yield
    report: pytest.CollectReport = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get(CI_ENV) == "1" and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"{CI_ENV}=1 allows no skip: {reason}"
