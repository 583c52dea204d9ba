"""The HTTP API on the Kafka backend (the suite's Apache Kafka broker).

``callgate serve --http`` runs the supervisor's children and, in its own process, tails
the view topics into memory; httpx talks to it over loopback. The same stories as on the
embedded backend: a high-impact refund approved over HTTP executes once, every read is
scoped to the bearer's tenant, the stream and the metrics come from the live views.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from callgate.bootstrap import Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.scope import bound_id
from tests.http import approval_flow
from tests.http_support import REFUND_BIG, HttpServe, bearer, wait_until
from tests.kafka_support import Deployment, unique_prefix

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]


@pytest.fixture(scope="module")
def kafka_http_serve(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HttpServe]:
    root = tmp_path_factory.mktemp("http-kafka")
    dep = Deployment(kafka_bootstrap, unique_prefix("http"), root / "state")
    serve = HttpServe(dep.state_dir, root / "serve.log", env=dep.env(), dev=True)
    try:
        serve.wait_ready(timeout_s=120)
        probe = serve.token("probe", "acme", "support")
        with serve.client(probe) as c:  # until every process has joined and answers
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
        yield serve
    finally:
        assert serve.stop() == 0, serve.log.read_text()
        assert "Traceback" not in serve.log.read_text(), serve.log.read_text()


def propose(kafka_http_serve: HttpServe, token: str, args: dict[str, Any], **body: Any) -> Any:
    key = body.pop("key", None)
    with kafka_http_serve.client(token) as c:
        r = c.post(
            "/v1/proposals",
            params={"wait": 30},
            json={"tool": "refunds.issue", "args": args, **body},
            headers={"Idempotency-Key": key} if key else {},
        )
    assert r.status_code == 200, r.text
    return r.json()


def pending_ids(c: httpx.Client) -> set[str]:
    return {p["invocation_id"] for p in c.get("/v1/pending").json()}


def test_no_valid_session_is_401(kafka_http_serve: HttpServe) -> None:
    with kafka_http_serve.client("nonsense") as c:
        r = c.get("/v1/pending")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"


def test_high_impact_refund_approved_over_http_executes_once(kafka_http_serve: HttpServe) -> None:
    """ADR 0029 on Apache Kafka: ``propose --wait`` prints ``executed`` after an approval
    over HTTP, without any resubmission; one effect; the resubmission replays (V2)."""
    approval_flow.refund_approved_over_http_runs_without_resubmission(kafka_http_serve)


def test_deploy_to_production_needs_two_distinct_release_managers(
    kafka_http_serve: HttpServe,
) -> None:
    """ADR 0030 on Apache Kafka: pending after one grant, executed after the second."""
    approval_flow.deploy_needs_two_distinct_release_managers(kafka_http_serve)


def test_reads_and_writes_are_scoped_to_the_bearers_tenant(kafka_http_serve: HttpServe) -> None:
    alice = kafka_http_serve.token("alice", "acme", "support")
    gina = kafka_http_serve.token("gina", "globex", "support", "finance-approver")
    mine = propose(kafka_http_serve, alice, {**REFUND_BIG, "order_id": "ORD-93"})
    inv = mine["invocation_id"]
    with kafka_http_serve.client(alice) as c:
        wait_until(lambda: inv in pending_ids(c), 30, "the pending view")
    with kafka_http_serve.client(gina) as c:
        r = c.get(f"/v1/invocations/{inv}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        r = c.post(f"/v1/invocations/{inv}/approve")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert inv not in pending_ids(c)
        assert c.get("/v1/audit", params={"invocation": inv}).json() == []
    with kafka_http_serve.client(kafka_http_serve.token("fran", "acme", "finance-approver")) as c:
        assert c.post(f"/v1/invocations/{inv}/deny", json={"reason": "done"}).status_code == 200


def test_stream_and_metrics_come_from_the_live_views(kafka_http_serve: HttpServe) -> None:
    alice = kafka_http_serve.token("alice", "acme", "support")
    with (
        httpx.Client(base_url=kafka_http_serve.url, headers=bearer(alice), timeout=60) as c,
        c.stream("GET", "/v1/pending/events") as stream,
    ):
        lines = stream.iter_lines()
        snapshots: list[list[dict[str, Any]]] = []
        new = propose(kafka_http_serve, alice, {**REFUND_BIG, "order_id": "ORD-94"})
        for line in lines:
            if line.startswith("data:"):
                snapshots.append(json.loads(line.split(":", 1)[1]))
                if new["invocation_id"] in {r["invocation_id"] for r in snapshots[-1]}:
                    break
    assert all(r["tenant"] == "acme" for snap in snapshots for r in snap)
    with kafka_http_serve.client(kafka_http_serve.token("fran", "acme", "finance-approver")) as c:
        assert c.post(f"/v1/invocations/{new['invocation_id']}/deny").status_code == 200
        text = c.get("/metrics").text
    assert 'callgate_decisions{code="approval_required",tool="refunds.issue"}' in text
    assert 'callgate_consumer_lag{process="invocations"}' in text
    assert "callgate_dead_letters 0.0" in text
    assert 'callgate_decision_latency_seconds_count{tool="refunds.issue"}' in text


def test_the_live_backend_follows_requests_in_memory(kafka_http_serve: HttpServe) -> None:
    """The server's read model used directly: a request followed to its settled status,
    and the partition key of a pending invocation, without reading ``events``."""
    env = kafka_http_serve.env
    settings = Settings(
        state_dir=kafka_http_serve.state_dir,
        backend="kafka",
        bootstrap_servers=env["CALLGATE_BOOTSTRAP_SERVERS"],
        topic_prefix=env["CALLGATE_TOPIC_PREFIX"],
        partitions=int(env["CALLGATE_PARTITIONS"]),
        dev=True,
    )
    app = bootstrap(settings)
    live = app.live_kafka_backend()
    live.start()
    try:
        wait_until(lambda: live.caught_up, 60, "the tail to catch up")
        alice = kafka_http_serve.token("alice", "acme", "support")
        inv = bound_id(alice, uuid.uuid4().hex)  # request ids are bound to the session
        request = ev.ToolCallProposed(
            event_id=str(uuid.uuid4()),
            invocation_id=inv,
            partition_key=partition_key("", None, inv),
            correlation_id=inv,
            occurred_at=app.clock(),
            producer="test",
            session_token=alice,
            tool="refunds.issue",
            args_json=json.dumps({**REFUND_BIG, "order_id": "ORD-95"}),
            idempotency_key=None,
            approval_id=None,
        )
        status = live.follow(request, "status", inv, lambda v: bool(v.get("settled")), 60)
        assert status is not None and status["outcome"] == "approval_required", status
        assert live.partition_key_of(inv) == request.partition_key
        assert live.partition_key_of("no-such-invocation") is None
    finally:
        live.close()
    with kafka_http_serve.client(kafka_http_serve.token("fran", "acme", "finance-approver")) as c:
        assert c.post(f"/v1/invocations/{inv}/deny").status_code == 200
