"""Policy versions and the shadow policy on Apache Kafka, through the command line
(ADR 0050): the events go to the broker and ``serve``'s decider folds them from there.

On Kafka the order between an activation (on ``events``) and a later proposal (on
``requests``) is not one log, so the tests wait until a probe call shows the switch.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import DEFAULT_PROFILE, EXIT_FAILED
from tests.e2e.test_policy_simulate import FORBID_OVER_500_EUR, candidate_profile
from tests.kafka_support import (
    PARTITIONS,
    Deployment,
    DeploymentSpec,
    ServeSpec,
    cg,
    cli,
    cli_ops,
    cli_propose,
    cli_session,
    key_on,
)

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]


KAFKA_DEPLOYMENT = DeploymentSpec(
    "pv",
    profile=DEFAULT_PROFILE,
    serve=(ServeSpec(flags=True, instance_id="a"), ServeSpec(flags=True, instance_id="b")),
)


def _refund(
    kafka_deployment: Deployment, token: str, n: int, amount: int = 90_000
) -> dict[str, Any]:
    args = {"order_id": f"ORD-{n}", "amount_cents": amount, "currency": "EUR",
            "issued_by": "alice"}  # fmt: skip
    return cli_propose(kafka_deployment, token, "refunds.issue", args)


def _until(what: str, check: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _on_every_partition(
    kafka_deployment: Deployment, token: str, what: str, *, forbidden: bool
) -> None:
    """Until a capped refund is (or is not) ``tool_forbidden`` on every partition, each
    reached through an idempotency key that hashes to it."""
    kafka_gateway = kafka_deployment.connect()
    try:
        for partition in range(PARTITIONS):
            args = {"order_id": f"ORD-{partition}", "amount_cents": 90_000,
                    "currency": "EUR", "issued_by": "alice"}  # fmt: skip

            def switched(p: int = partition, a: dict[str, Any] = args) -> bool:
                answer = kafka_gateway.propose(token, "refunds.issue", a, idempotency_key=key_on(p))
                return bool((answer["outcome"] == "tool_forbidden") == forbidden)

            _until(f"{what} on partition {partition}", switched)
    finally:
        kafka_gateway.close()


def test_publish_shadow_activate_rollback_on_kafka(
    kafka_deployment: Deployment, tmp_path: Path
) -> None:
    ops = cli_ops(kafka_deployment)
    alice = cli_session(kafka_deployment, "alice", "acme", "support")
    base = cg(kafka_deployment, "policy", "publish", str(DEFAULT_PROFILE), "--session", ops,
              "--reason", "baseline")["published"]  # fmt: skip
    candidate = candidate_profile(tmp_path, FORBID_OVER_500_EUR)
    strict = cg(kafka_deployment, "policy", "publish", str(candidate), "--session", ops,
                "--reason", "cap")["published"]  # fmt: skip

    # Shadow: once the decider has folded it, every capped refund is one difference and
    # keeps the outcome the active version gives it.
    cg(kafka_deployment, "policy", "shadow", strict, "--session", ops, "--reason", "watch")
    probes: set[str] = set()

    def probe_differs() -> bool:
        answer = _refund(kafka_deployment, alice, len(probes))
        assert answer["outcome"] != "tool_forbidden"
        probes.add(answer["invocation_id"])
        report = cg(kafka_deployment, "policy", "shadow", "report", "--session", ops)
        return bool({d["invocation_id"] for d in report["differences"]} & probes)

    _until("the shadow version on the decider", probe_differs)
    expected = {_refund(kafka_deployment, alice, 100 + n)["invocation_id"] for n in range(3)}
    _refund(kafka_deployment, alice, 200, amount=40_000)  # under the cap: no difference
    report = cg(kafka_deployment, "policy", "shadow", "report", "--session", ops)
    differed = {d["invocation_id"] for d in report["differences"]}
    assert expected <= differed and differed <= expected | probes
    assert all(d["candidate_outcome"] == "tool_forbidden" for d in report["differences"])

    # Activate, then roll back: the deciders of both instances switch without a restart,
    # on every partition (ADR 0064).
    cg(kafka_deployment, "policy", "activate", strict, "--session", ops, "--reason", "go")
    _on_every_partition(kafka_deployment, alice, "the activation", forbidden=True)
    cg(kafka_deployment, "policy", "activate", base, "--session", ops, "--reason", "rollback")
    _on_every_partition(kafka_deployment, alice, "the rollback", forbidden=False)

    history = cg(kafka_deployment, "policy", "history", "--session", ops)
    assert history["active"] == base and history["shadow"] == strict
    assert [h["action"] for h in history["history"]] == [
        "published", "published", "shadow", "activated", "activated",
    ]  # fmt: skip

    # Refusals: nothing is written.
    broken = candidate_profile(tmp_path / "b", "forbid (principal, action")
    bad = cli(kafka_deployment, "policy", "publish", str(broken), "--session", ops, "--reason", "x",
              rc=EXIT_FAILED).value  # fmt: skip
    assert bad["error"]["code"] == "policy_version_invalid"
    for argv in (
        ("publish", str(DEFAULT_PROFILE), "--reason", "x"),
        ("activate", strict, "--reason", "x"),
        ("shadow", "--off"),
        ("history",),
    ):
        refused = cli(kafka_deployment, "policy", *argv, "--session", alice, rc=EXIT_FAILED).value
        assert refused["error"]["code"] == "operator_required"
    assert cg(kafka_deployment, "policy", "history", "--session", ops) == history
