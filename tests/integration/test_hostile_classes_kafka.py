"""The four hostile-input classes (``tests.hostile_scenarios``) on the Kafka backend: one
``callgate serve`` on the suite's Apache Kafka broker, the SDK as an agent platform uses it, and
raw records on ``requests`` as a hand-written client would put them there.

serve's children get a 6 s session timeout (``FAST_GROUP_SETTINGS``): a shorter failover.
"""

from __future__ import annotations

import pytest
from tests.hostile_scenarios import (
    cross_tenant_scenario,
    limits_scenario,
    poison_scenario,
    self_approval_scenario,
    spelled_identity_scenario,
    strict_record_scenario,
)
from tests.kafka_support import Deployment, DeploymentSpec

from callgate.domain import events as ev
from callgate.surfaces.sdk import Gateway

pytestmark = pytest.mark.kafka


KAFKA_DEPLOYMENT = DeploymentSpec("hostile")


def dead_letters(kafka_deployment: Deployment) -> list[ev.EventDeadLettered]:
    return [
        e for _, e in kafka_deployment.events("dead-letter") if isinstance(e, ev.EventDeadLettered)
    ]


def test_poison_values_get_a_code_and_the_partition_moves_on(
    kafka_deployment: Deployment, kafka_gateway: Gateway
) -> None:
    poison_scenario(kafka_gateway, lambda: dead_letters(kafka_deployment))


def test_another_tenant_cannot_overwrite_or_block_an_invocation(
    kafka_deployment: Deployment, kafka_gateway: Gateway
) -> None:
    cross_tenant_scenario(kafka_gateway, lambda: dead_letters(kafka_deployment))


def test_the_actor_cannot_approve_their_own_call_under_another_spelling(
    kafka_gateway: Gateway,
) -> None:
    self_approval_scenario(kafka_gateway)


def test_the_sdk_refuses_arguments_over_the_limits_with_a_code(kafka_gateway: Gateway) -> None:
    """Oversized arguments included: refused with ``invalid_arguments`` before producing,
    never by the client library's raw exception."""
    limits_scenario(kafka_gateway)


def test_other_spellings_of_tenant_and_role_get_nothing(kafka_gateway: Gateway) -> None:
    spelled_identity_scenario(kafka_gateway)


def test_unreadable_arguments_in_a_record_are_dead_lettered_never_decided(
    kafka_deployment: Deployment, kafka_gateway: Gateway
) -> None:
    strict_record_scenario(kafka_gateway, lambda: dead_letters(kafka_deployment))
