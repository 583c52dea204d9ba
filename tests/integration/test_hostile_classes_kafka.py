"""The four hostile-input classes (``tests.hostile_scenarios``) on the Kafka backend: one
``callgate serve`` on the suite's Apache Kafka broker, the SDK as an agent platform uses it, and
raw records on ``requests`` as a hand-written client would put them there.

serve's children get a 6 s session timeout (``FAST_GROUP_SETTINGS``): a shorter failover.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tests.hostile_scenarios import (
    cross_tenant_scenario,
    limits_scenario,
    poison_scenario,
    self_approval_scenario,
    spelled_identity_scenario,
    strict_record_scenario,
)
from tests.kafka_support import Deployment, KafkaServe, unique_prefix

from callgate.domain import events as ev
from callgate.surfaces.sdk import Gateway

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def dep(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    state = tmp_path_factory.mktemp("kafka-hostile") / "state"
    return Deployment(kafka_bootstrap, unique_prefix("hostile"), state)


@pytest.fixture(scope="module")
def gate(dep: Deployment) -> Iterator[Gateway]:
    server = KafkaServe(dep, dep.state_dir.parent / "serve.log")
    try:
        server.wait_ready()
        gateway = dep.connect()
        try:
            yield gateway
        finally:
            gateway.close()
    finally:
        code = server.stop()
    assert code == 0, server.log.read_text()


def dead_letters(dep: Deployment) -> list[ev.EventDeadLettered]:
    return [e for _, e in dep.events("dead-letter") if isinstance(e, ev.EventDeadLettered)]


def test_poison_values_get_a_code_and_the_partition_moves_on(
    dep: Deployment, gate: Gateway
) -> None:
    poison_scenario(gate, lambda: dead_letters(dep))


def test_another_tenant_cannot_overwrite_or_block_an_invocation(
    dep: Deployment, gate: Gateway
) -> None:
    cross_tenant_scenario(gate, lambda: dead_letters(dep))


def test_the_actor_cannot_approve_their_own_call_under_another_spelling(gate: Gateway) -> None:
    self_approval_scenario(gate)


def test_the_sdk_refuses_arguments_over_the_limits_with_a_code(gate: Gateway) -> None:
    """Oversized arguments included: refused with ``invalid_arguments`` before producing,
    never by the client library's raw exception."""
    limits_scenario(gate)


def test_other_spellings_of_tenant_and_role_get_nothing(gate: Gateway) -> None:
    spelled_identity_scenario(gate)


def test_unreadable_arguments_in_a_record_are_dead_lettered_never_decided(
    dep: Deployment, gate: Gateway
) -> None:
    strict_record_scenario(gate, lambda: dead_letters(dep))
