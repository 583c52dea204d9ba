"""A network that misbehaves (issue 42; ADR 0088): the short form of ``make chaos-network``.

Toxiproxy between two callgate instances and their Apache Kafka broker, and between them
and an HTTP upstream: the broker unreachable when the instances start, then latency,
a blackhole and connection resets on the broker's proxy, and a blackhole and resets on
the upstream's. Every check of the chaos run holds, every agent's call during a fault gets
a coded answer within its bounded waits (and a start-up allowance), and every fault's cost is
printed. Skipped, with the reason, where Toxiproxy or Apache Kafka is absent; with
``CALLGATE_REQUIRE_TOXIPROXY=1`` (CI) an absent Toxiproxy fails the test instead.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from tests.kafka_support import require_broker, run_tool
from tools.network_faults import PROBE_BOUND_S, Fault, Plan, campaign
from tools.toxiproxy import unavailable

REQUIRE_ENV = "CALLGATE_REQUIRE_TOXIPROXY"  # "1": Toxiproxy must be there (CI)
SHORT = ("--network", "--short", "--instances", "2", "--hold", "6", "--blackhole", "8",
         "--gap", "4", "--rate", "6", "--seed", "5")  # fmt: skip


def require_toxiproxy() -> None:
    """Skip, printing why, where no Toxiproxy server is built; fail under ``REQUIRE_ENV``."""
    reason = unavailable()
    if reason is None:
        return
    print(f"network tests skipped: {reason}", file=sys.stderr)
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
    pytest.skip(f"network tests skipped: {reason}")


@pytest.mark.kafka
@pytest.mark.timeout(300)
def test_a_network_that_misbehaves_loses_nothing_and_never_leaves_an_agent_hanging(
    tmp_path: Path,
) -> None:
    """The short campaign: lost 0, double 0, unapproved 0, audit and replay equal; each
    agent's call answered a code in time; the broker's blackhole stopped all work (every
    connection passes the proxy); every fault recovered and its cost printed."""
    require_toxiproxy()
    require_broker()
    run = run_tool(tmp_path, "chaos", *SHORT, timeout=280)
    report = json.loads(run.stdout)
    figures = report["figures"]
    print("\nchaos --network (short):")
    for row in report["faults"]:
        print(f"  {json.dumps(row)}")
    assert report["violations"] == [], report["violations"][:20]
    assert run.returncode == 0, run.stderr[-3000:]
    assert figures["lost"] == 0 and figures["double effects"] == 0
    assert figures["unapproved high-impact effects"] == 0
    assert figures["uncertain outcomes not reconciled"] == 0
    assert figures["audit chain ok"] is True and figures["replay equal"] is True
    assert figures["limit refusals"] > 0 and figures["reservations leaked"] == 0
    assert figures["upstream effects"] > 0  # the upstream served calls through its proxy
    assert figures["flows done in a broker blackhole"] == 0
    faults = {row["fault"]: row for row in report["faults"]}
    assert len(faults) == 6, sorted(faults)
    for row in faults.values():
        assert row["agent call"] and row["agent call s"] <= PROBE_BOUND_S
        assert row["recovery s"] is not None and row["cost s"] is not None
    assert faults["broker unreachable at start"]["flows/s during"] == 0


def test_the_campaign_takes_each_fault_to_the_broker_and_to_the_upstream() -> None:
    """The full campaign: the start, then latency, bandwidth, blackhole and resets on each
    proxy; the short one keeps the start, the broker's latency, and the blackhole and
    resets of both."""
    full = campaign(30, 30)
    assert [(p.proxy, p.kind) for p in full] == [
        ("kafka", "start"),
        *[(proxy, kind) for proxy in ("kafka", "upstream")
          for kind in ("latency", "bandwidth", "blackhole", "reset")],
    ]  # fmt: skip
    assert [p.hold_s for p in full if p.kind == "blackhole"] == [30, 30]
    short = [(p.proxy, p.kind) for p in campaign(6, 8, short=True)]
    assert short == [
        ("kafka", "start"),
        ("kafka", "latency"),
        ("kafka", "blackhole"),
        ("kafka", "reset"),
        ("upstream", "blackhole"),
        ("upstream", "reset"),
    ]


def test_a_fault_costs_the_throughput_it_took_and_its_recovery() -> None:
    """cost = held x (1 - rate during / rate before) + recovery; all of it when nothing
    ran before (the start); unknown while it has not recovered."""
    plan = Plan("p", "kafka", "latency", 10)
    slowed = Fault(plan, started=0, ended=10, rate_before=20, rate_during=5, recovery_s=2)
    assert slowed.cost_s == 10 * (1 - 5 / 20) + 2
    faster = Fault(plan, started=0, ended=10, rate_before=5, rate_during=20, recovery_s=0)
    assert faster.cost_s == 0
    start = Fault(plan, started=0, ended=10, rate_before=0, rate_during=0, recovery_s=3)
    assert start.cost_s == 13
    assert Fault(plan, started=0, ended=10, rate_before=5).cost_s is None
