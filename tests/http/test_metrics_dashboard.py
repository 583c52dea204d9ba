"""``docs/grafana-dashboard.json`` is built only on metrics ``/metrics`` serves.

A ``callgate serve --http`` on the embedded store runs one call (so the provider figures
have samples) and one approval (the approval wait gets one, ``granted``); every
``callgate_*`` name in the dashboard's queries, without a histogram's ``_bucket``/``_sum``/
``_count`` suffix, must be a metric family of the page it serves.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import REPO, cg, propose, session
from tests.http_support import HttpServe, wait_until

pytestmark = pytest.mark.e2e

DASHBOARD = REPO / "docs" / "grafana-dashboard.json"
NAME = re.compile(r"\bcallgate_[a-z_]+\b")
SUFFIXES = ("_bucket", "_sum", "_count")


def dashboard_names() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    names = set()
    for expr in exprs:
        for name in NAME.findall(expr):
            for suffix in SUFFIXES:
                name = name.removesuffix(suffix)
            names.add(name)
    return names


@pytest.fixture
def http_serve(tmp_path: Path) -> Iterator[HttpServe]:
    server = HttpServe(tmp_path / "state", tmp_path / "serve.log", dev=True)
    try:
        server.wait_ready()
        yield server
    finally:
        assert server.stop() == 0, server.log.read_text()


def test_every_metric_of_the_dashboard_is_served(http_serve: HttpServe) -> None:
    alice = session(http_serve.state_dir, "alice", "acme", "support")
    answer = propose(http_serve.state_dir, alice, "tickets.read", {"ticket_id": "T-1"})
    assert answer["outcome"] == "executed", answer
    refund = {"order_id": "ORD-42", "amount_cents": 5000, "currency": "EUR"}
    asked = propose(http_serve.state_dir, alice, "refunds.issue", refund, key="m-1")
    assert asked["outcome"] == "approval_required", asked
    cg(http_serve.state_dir, "approve", asked["invocation_id"], "--session", alice)
    waited = 'callgate_approval_wait_seconds_count{result="granted",tool="refunds.issue"} 1.0'
    wait_until(lambda: waited in http_serve.client().get("/metrics").text, 30, "the approval wait")
    # A call through the API: its time to the final outcome is observed.
    with http_serve.client(alice) as c:
        r = c.post("/v1/proposals", json={"tool": "tickets.read", "args": {"ticket_id": "T-2"}})
    assert r.status_code == 200, r.text
    page = http_serve.client().get("/metrics").text
    families = set(re.findall(r"^# TYPE (\S+) ", page, flags=re.M))
    served_names = families | {f"{f}_total" for f in families}
    wanted = dashboard_names()
    assert {
        "callgate_provider_call_seconds",
        "callgate_pending_age_seconds",
        "callgate_approval_wait_seconds",
        "callgate_outcome_latency_seconds",
    } <= wanted
    assert wanted <= served_names, sorted(wanted - served_names)
    assert re.search(
        r'^callgate_outcome_latency_seconds_count\{outcome="executed",tool="tickets.read"\} 1\.0$',
        page,
        flags=re.M,
    ), page
    # The provider histogram has the executor's two calls in it (CLI and API).
    assert re.search(
        r'^callgate_provider_call_seconds_count\{operation="execute",provider="tickets"\} 2\.0$',
        page,
        flags=re.M,
    ), page
