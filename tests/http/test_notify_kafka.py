"""Approvers are told, on the Kafka backend (each broker the suite starts): the stories of
``test_notify`` against ``callgate serve --http`` on a Kafka deployment, whose decider
runs in a child process that trusts the Slack clicks' issuer from the same configuration.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.http.test_notify import (
    Setup,
    test_a_failing_receiver_is_retried_with_backoff_then_dead_lettered,
    test_a_pending_refund_is_told_by_webhook_and_slack_and_approved_in_slack,
    test_a_refund_the_agent_waits_on_is_approved_in_slack_and_runs_once,
    test_hostile_interaction_bodies_are_refused_with_a_code_and_approve_nothing,
    test_slack_refusals_are_coded_and_approve_nothing,
)
from tests.http_support import wait_until
from tests.kafka_support import Deployment, unique_prefix

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

__all__ = [
    "test_a_failing_receiver_is_retried_with_backoff_then_dead_lettered",
    "test_a_pending_refund_is_told_by_webhook_and_slack_and_approved_in_slack",
    "test_a_refund_the_agent_waits_on_is_approved_in_slack_and_runs_once",
    "test_hostile_interaction_bodies_are_refused_with_a_code_and_approve_nothing",
    "test_slack_refusals_are_coded_and_approve_nothing",
]


@pytest.fixture(scope="module")
def notify_setup(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("notify-kafka")
    dep = Deployment(kafka_bootstrap, unique_prefix("notify"), root / "state")
    setup = Setup(root, env=dep.env(), state_dir=dep.state_dir)
    try:
        probe = setup.serve.token("probe", "acme", "support")
        with setup.serve.client(probe) as c:  # until every process has joined and answers
            wait_until(
                lambda: (
                    c.post(
                        "/v1/proposals",
                        params={"wait": 30},
                        json={"tool": "tickets.read", "args": {"ticket_id": "T-0"}},
                    ).status_code
                    == 200
                ),
                120,
                "a first call to be decided",
                poll_s=0.5,
            )
        yield setup
    finally:
        setup.stop()
