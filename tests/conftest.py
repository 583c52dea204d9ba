"""Shared fixtures and the test tiers.

Tiers (ADR 0024): a test's markers decide which ``make`` target runs it. ``make test`` runs
every test without ``kafka``, ``browser`` or ``fuzz``; ``make test-kafka``, ``make
test-browser`` and ``make test-fuzz`` run those. A test that takes the broker fixture is
marked ``kafka`` here even where its module forgot to say so.

The broker: Apache Kafka from Maven (``tools.apache_kafka``), the reference broker,
started once per test session (under pytest-xdist: once per worker) and stopped at its
end; tests keep apart by topic prefix. Where it cannot start (no Java 17, no jars) its
tests skip with the reason printed, unless ``CALLGATE_REQUIRE_APACHE_KAFKA=1`` (``make
test-kafka``), which turns the skip into a failure.

``CALLGATE_CI=1`` (``.ci/run``) turns every skip into a failure: CI installs every real
dependency a test may skip for (Java and the Kafka jars, Chromium, uv), so a skip there
means a dependency went missing, not that it is absent by design.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from tools.apache_kafka import ApacheKafka

from callgate.surfaces.sdk import Gateway
from tests.kafka_support import (
    Broker,
    Deployment,
    DeploymentSpec,
    KafkaServe,
    require_broker,
    serving,
    unique_prefix,
)

# Property tests assert properties, not speed: Hypothesis's per-example deadline (200 ms)
# and its too-slow health check measure the machine, and on two cores shared with brokers
# and browsers an example can take longer while nothing is wrong. Speed has its benchmarks.
settings.register_profile("callgate", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("callgate")

BROKER_FIXTURES = {"kafka_broker", "kafka_bootstrap"}


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[Broker]:
    """An Apache Kafka broker started for this test session (or xdist worker)."""
    require_broker()
    with ApacheKafka() as server:
        yield Broker("apache", server.bootstrap)
        # Destroy clients the tests dropped while the broker still answers, so their
        # background threads do not log connection failures after the run's summary.
        gc.collect()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: Broker) -> str:
    """``host:port`` of the session's broker."""
    return kafka_broker.bootstrap


@pytest.fixture(scope="module")
def kafka_serve(
    request: pytest.FixtureRequest, kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KafkaServe]:
    """``callgate serve`` of the test module's deployment on the session's broker, ready, for
    the whole module (the first instance, when the module runs more). The module says what
    it deploys in ``KAFKA_DEPLOYMENT``, a ``tests.kafka_support.DeploymentSpec``."""
    spec = getattr(request.module, "KAFKA_DEPLOYMENT", None)
    assert isinstance(spec, DeploymentSpec), f"{request.module.__name__}: no KAFKA_DEPLOYMENT"
    root = tmp_path_factory.mktemp(f"{spec.label}-kafka")
    profile = spec.profile(root) if callable(spec.profile) else spec.profile
    dep = Deployment(kafka_bootstrap, unique_prefix(spec.label), root / "state", profile)
    with serving(dep, root, spec.serve) as server:
        yield server


@pytest.fixture(scope="module")
def kafka_deployment(kafka_serve: KafkaServe) -> Deployment:
    """The test module's deployment on the session's broker (``KAFKA_DEPLOYMENT``), served
    for the whole module."""
    return kafka_serve.dep


@pytest.fixture(scope="module")
def kafka_gateway(kafka_deployment: Deployment) -> Iterator[Gateway]:
    """An SDK client of the module's served deployment, closed at the module's end."""
    gateway = kafka_deployment.connect()
    try:
        yield gateway
    finally:
        gateway.close()


@pytest.fixture
def anyio_backend() -> str:
    """The event loop of ``pytest.mark.anyio`` tests: asyncio, the one callgate runs on."""
    return "asyncio"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes the broker belongs to the Kafka tier, marked or not."""
    for item in items:
        if BROKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kafka)


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
