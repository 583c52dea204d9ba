"""``callgate policy simulate`` on the Kafka backend: the history read from the broker."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import DEFAULT_PROFILE
from tests.e2e.test_policy_simulate import FORBID_OVER_500_EUR, candidate_profile
from tests.kafka_support import (
    Deployment,
    DeploymentSpec,
    ServeSpec,
    cg,
    cli_ops,
    cli_propose,
    cli_session,
)

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

# (tenant, amount_cents, currency): the calls of the recorded history.
REFUNDS = [
    ("acme", 40_000, "EUR"),
    ("acme", 60_000, "EUR"),  # over 500 EUR: the candidate forbids it
    ("acme", 90_000, "USD"),
    ("acme", 150_000, "EUR"),  # over 500 EUR and high impact
    ("globex", 60_000, "EUR"),  # another tenant's order: forbidden as recorded already
]


KAFKA_DEPLOYMENT = DeploymentSpec("sim", profile=DEFAULT_PROFILE, serve=(ServeSpec(flags=True),))


def test_simulation_reads_the_history_from_the_broker(
    kafka_deployment: Deployment, tmp_path: Path
) -> None:
    sessions = {
        "acme": cli_session(kafka_deployment, "alice", "acme", "support"),
        "globex": cli_session(kafka_deployment, "gina", "globex", "support"),
    }
    cli_propose(kafka_deployment, sessions["acme"], "tickets.read", {"ticket_id": "T-1"})
    expected = set()
    alices: list[str] = []
    for n, (tenant, amount, currency) in enumerate(REFUNDS):
        user = "alice" if tenant == "acme" else "gina"
        args = {"order_id": f"ORD-{n}", "amount_cents": amount, "currency": currency,
                "issued_by": user}  # fmt: skip
        answer = cli_propose(
            kafka_deployment, sessions[tenant], "refunds.issue", args, key=f"sim-{n}"
        )
        if tenant == "acme" and currency == "EUR" and amount > 50_000:
            expected.add(answer["invocation_id"])
        if user == "alice":
            alices.append(answer["invocation_id"])
    candidate = candidate_profile(tmp_path, FORBID_OVER_500_EUR)

    report = cg(
        kafka_deployment,
        "policy",
        "simulate",
        str(candidate),
        "--session",
        cli_ops(kafka_deployment),
    )

    # Every call above, and the refund of 1 EUR that ``wait_ready`` proposes as its probe.
    assert report["decided"] == 1 + len(REFUNDS) + 1
    assert report["changed"] == len(expected) == 2
    assert {e["invocation_id"] for e in report["examples"]} == expected
    assert report["by_tool"] == {"refunds.issue": 2}

    # A candidate's limit, replayed in order over what the broker holds (ADR 0079): alice's
    # first two refunds wait for their owner and hold the two a day allowed; the third and
    # the fourth would have been refused; gina's is forbidden by the policy, counting nothing.
    limited = candidate_profile(tmp_path / "limited", "")
    raw = yaml.safe_load(limited.read_text())
    raw["limits"] = [{"name": "two-refunds", "tools": ["refunds.issue"], "max": 2,
                      "window": "24h", "per": ["actor"]}]  # fmt: skip
    limited.write_text(yaml.safe_dump(raw, sort_keys=False))

    report = cg(
        kafka_deployment, "policy", "simulate", str(limited), "--session", cli_ops(kafka_deployment)
    )

    refused = report["limit_refusals"]
    assert [r["invocation_id"] for r in refused] == alices[2:]
    assert {(r["actor"], r["limit"], r["used"], r["max"]) for r in refused} == {
        ("alice", "two-refunds", 2, 2)
    }
