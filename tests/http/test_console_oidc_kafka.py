"""Sign-in with the identity provider on the Kafka backend (each broker the suite starts):
the stories of ``test_console_oidc``, where the ID token in the console's cookie is also
verified by the decider in its own child process (discovery and keys from the provider).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.http.test_console_oidc import (
    Deployment,
    test_a_callback_not_started_by_this_browser_signs_nobody_in,
    test_a_cookie_request_without_its_csrf_token_is_refused_and_does_nothing,
    test_a_hostile_callback_query_signs_nobody_in,
    test_a_refund_the_agent_waits_on_is_approved_in_the_console_and_runs_once,
    test_an_id_token_without_tenant_and_roles_signs_nobody_in,
    test_approver_signs_in_with_the_provider_approves_reloads_and_signs_out,
    test_hostile_bodies_to_the_sign_in_endpoints_are_refused_and_change_nothing,
)
from tests.http_support import wait_until
from tests.kafka_support import Deployment as KafkaDeployment
from tests.kafka_support import unique_prefix

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

__all__ = [
    "test_a_callback_not_started_by_this_browser_signs_nobody_in",
    "test_a_cookie_request_without_its_csrf_token_is_refused_and_does_nothing",
    "test_a_hostile_callback_query_signs_nobody_in",
    "test_a_refund_the_agent_waits_on_is_approved_in_the_console_and_runs_once",
    "test_an_id_token_without_tenant_and_roles_signs_nobody_in",
    "test_approver_signs_in_with_the_provider_approves_reloads_and_signs_out",
    "test_hostile_bodies_to_the_sign_in_endpoints_are_refused_and_change_nothing",
]


@pytest.fixture(scope="module")
def oidc_deployment(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("oidc-kafka")
    kafka = KafkaDeployment(kafka_bootstrap, unique_prefix("oidc"), root / "state", dev=False)
    d = Deployment(root, env=kafka.env(), state_dir=kafka.state_dir)
    try:
        with d.serve.client(d.agent()) as c:  # until every process has joined and answers
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
        yield d
    finally:
        d.stop()
