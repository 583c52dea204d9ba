"""``callgate serve`` killed with SIGKILL mid-stream, again and again (C8, C9, C12).

A separate process publishes a stream of proposals into the log (embedded, then Apache
Kafka) without waiting for any of them, while the test SIGKILLs
``callgate serve`` at random moments and starts it again. At the end every proposal must
have settled exactly once with the outcome it would have had without the crashes, every
ticket must have been created exactly once, and the audit trail and the projections must
still agree with the log.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from callgate.adapters.embedded.store import EmbeddedStore
from callgate.application.replay import replay
from callgate.domain.codes import Code
from tests.e2e.helpers import (
    Serve,
    cg,
    make_plan,
    ops,
    runner_lock_held,
    session,
    start_publisher,
    write_plan,
)
from tests.kafka_support import Broker, Deployment, KafkaServe, operator, token, unique_prefix

pytestmark = pytest.mark.e2e

PROPOSALS = 360
KILLS = 4  # at least; more while the publisher is still going
VOCABULARY = {c.value for c in Code}
# Provider latency (docs/contract.md "Providers": the simulations inject delay) stretches the time
# between a ticket's effect and the commit of its outcome, where a kill hurts most.
SLOW_TICKETS = {"CALLGATE_FAULTS": '{"tickets": {"latency_ms": 4}}'}
# Events that happen at most once per invocation, however often serve restarts.
ONCE = (
    "PolicyDecided",
    "ProposalRejected",
    "ApprovalRequested",
    "DryRunRequested",
    "ExecutionSucceeded",
    "ReplayServed",
)


def counts(store: EmbeddedStore, ids: set[str]) -> tuple[int, int]:
    """(published, settled) proposals of the plan, read from the log and the status view."""
    published = len(store.read_log("requests", limit=1_000_000))
    settled = 0
    for key, raw in store.view_items("status"):
        settled += key in ids and json.loads(raw)["settled"]
    return published, settled


def test_sigkill_serve_mid_stream_settles_everything_exactly_once(tmp_path: Path) -> None:
    """C12 (no second side effect after a crash), C8 (replays, conflicts), C9 (audit chain),
    docs/contract.md "Shape" (projections rebuilt from the log equal the live ones)."""
    rng = random.Random(20240607)
    state = tmp_path / "state"
    alice = session(state, "alice", "acme", "support")
    gina = session(state, "gina", "globex", "support")
    plan = make_plan(rng, alice, gina, PROPOSALS, tag="k")
    ids = {p.invocation_id for p in plan}
    plan_file = tmp_path / "plan.json"
    write_plan(plan_file, state, plan, pause_s=0.01)
    store = EmbeddedStore(state)

    serve = Serve(state, tmp_path / "serve-0.log", SLOW_TICKETS)
    serve.wait_serving()
    publisher = start_publisher(plan_file)
    kills = mid_stream = 0
    try:
        while (publisher.poll() is None or kills < KILLS) and kills < 12:
            serve.wait_serving()
            time.sleep(rng.uniform(0.02, 0.35))
            published, settled = counts(store, ids)
            serve.kill()
            kills += 1
            mid_stream += settled < published
            assert not runner_lock_held(state)  # the kernel dropped the dead server's lock
            serve = Serve(state, tmp_path / f"serve-{kills}.log", SLOW_TICKETS)
        assert publisher.wait(timeout=60) == 0
        serve.wait_serving()
        deadline = time.monotonic() + 60
        while counts(store, ids)[1] < len(plan):
            assert time.monotonic() < deadline, f"unsettled: {counts(store, ids)}"
            time.sleep(0.05)
    finally:
        if publisher.poll() is None:
            publisher.kill()
        code = serve.stop()
    assert code == 0
    assert mid_stream >= 3, f"only {mid_stream} of {kills} kills landed with work in flight"

    # Every proposal: one settled status with the outcome it would have had anyway.
    by_id = {p.invocation_id: p for p in plan}
    for p in plan:
        raw = store.view("status", p.invocation_id)
        assert raw is not None, p
        status = json.loads(raw)
        assert status["settled"] is True and status["outcome"] in VOCABULARY
        assert status["outcome"] == p.expect, (p, status)

    # The log: no decision or result was emitted twice for one invocation.
    events: Counter[tuple[str, str]] = Counter()
    for row in store.read_log("events", limit=1_000_000):
        if row.invocation_id in ids:
            events[(row.invocation_id, row.event_type or "")] += 1
    twice = {k: n for k, n in events.items() if k[1] in ONCE and n > 1}
    assert not twice, twice

    # C9: exactly one audit record per invocation, with its outcome.
    audit = cg(state, "audit", "--session", ops(state))
    per_invocation = Counter(r["invocation_id"] for r in audit)
    assert set(per_invocation) == ids and set(per_invocation.values()) == {1}
    assert all(r["outcome"] == by_id[r["invocation_id"]].expect for r in audit)
    assert all(r["proposed_by"] == "model" for r in audit)

    # C12: exactly one effect per (tenant, key) that executed; nothing else ran.
    effects = cg(state, "effects")
    executed = {p.invocation_id for p in plan if p.expect == "executed" and p.key}
    assert {e["tool"] for e in effects} == {"tickets.create"}
    per_call = Counter(e["invocation_id"] for e in effects)
    assert not {i: n for i, n in per_call.items() if n > 1}, "a call ran twice"
    assert set(per_call) == executed
    tokens = Counter(e["token"] for e in effects)
    assert set(tokens.values()) == {1}, [t for t, n in tokens.items() if n > 1]
    keys = Counter(
        (by_id[e["invocation_id"]].tenant, by_id[e["invocation_id"]].key) for e in effects
    )
    assert set(keys.values()) == {1}

    # Replays serve the original result (C8).
    first_result = {
        (p.tenant, p.key): json.loads(store.view("status", p.invocation_id) or "{}")["result"]
        for p in plan
        if p.invocation_id in executed
    }
    for p in plan:
        if p.expect == "replayed":
            status = json.loads(store.view("status", p.invocation_id) or "{}")
            assert status["result"] == first_result[(p.tenant, p.key)], p

    # The approval UI sees every refund once; audit chain and projections still agree.
    refunds = {p.invocation_id for p in plan if p.expect == "approval_required"}
    pending = [r["invocation_id"] for r in cg(state, "pending", "--session", ops(state))]
    assert sorted(pending) == sorted(refunds)
    verified = cg(state, "audit", "verify")
    assert verified["ok"] is True and verified["records"] == len(audit)
    replay = cg(state, "replay")
    assert replay["equal"] is True, replay
    store.close()


# --- the same on Kafka: whole instances SIGKILLed ---------------------------------------------

KAFKA_PROPOSALS = 160
KAFKA_KILLS = 3


@pytest.mark.kafka
def test_sigkill_serve_on_kafka_mid_stream_settles_everything_exactly_once(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    """C8, C9, C12 on Kafka: ``callgate serve`` and all its children SIGKILLed at random
    moments while a publisher streams proposals, restarted each time (same instance id: it
    fences its previous self). Every proposal settles once with the outcome it would have
    had; one effect per executed key; audit and replay agree; no event is on the log twice
    (``read_committed`` hides a killed writer's open transaction). Every restart is
    immediate."""
    rng = random.Random(20261201)
    dep = Deployment(kafka_broker.bootstrap, unique_prefix("crash"), tmp_path / "state")
    serve = KafkaServe(dep, tmp_path / "serve-0.log", extra_env=SLOW_TICKETS)
    serve.wait_ready()  # creates the topics a client needs
    gate = dep.connect()
    try:
        alice = token(gate, "alice", "acme", "support")
        gina = token(gate, "gina", "globex", "support")
        plan = make_plan(rng, alice, gina, KAFKA_PROPOSALS, tag="kk")
        ids = {p.invocation_id for p in plan}

        def audited() -> Counter[str]:
            audit = gate.audit(session=operator(gate))
            return Counter(r["invocation_id"] for r in audit if r["invocation_id"] in ids)

        plan_file = tmp_path / "plan.json"
        write_plan(plan_file, dep.state_dir, plan, pause_s=0.02, env=dep.env())
        publisher = start_publisher(plan_file)
        kills, more = 0, True
        try:
            while more:
                time.sleep(rng.uniform(0.5, 2.5))
                serve.kill_instance()
                kills += 1
                more = (publisher.poll() is None or kills < KAFKA_KILLS) and kills < 6
                serve = KafkaServe(dep, tmp_path / f"serve-{kills}.log", extra_env=SLOW_TICKETS)
                serve.wait_started()
            assert publisher.wait(timeout=60) == 0

            def settled() -> bool:
                return all((gate.backend.view("status", i) or {}).get("settled") for i in ids)

            if not gate.backend.wait(settled, 180):
                open_ids = {
                    i for i in ids if not (gate.backend.view("status", i) or {}).get("settled")
                }
                trail = {i: dep.event_types(i) for i in sorted(open_ids)[:5]}
                logs = [tmp_path / f"serve-{n}.log" for n in range(kills + 1)]
                raise AssertionError(
                    f"{len(open_ids)} proposals never settled: {trail}; {serve.diagnosis(logs)}"
                )

            # The audit and pending projections are children of their own: after a restart
            # they may still be catching up with the status view, and only a running serve
            # lets them finish.
            def caught_up() -> bool:
                return set(audited()) == ids and gate.verify_audit().ok and replay(gate)["equal"]

            assert gate.backend.wait(caught_up, 120), ids - set(audited())
        finally:
            if publisher.poll() is None:
                publisher.kill()
            code = serve.stop()
        assert code == 0

        by_id = {p.invocation_id: p for p in plan}
        for p in plan:
            status = gate.backend.view("status", p.invocation_id) or {}
            assert status["outcome"] == p.expect, (p, status)

        logged = [(r, e) for r, e in dep.events() if e.invocation_id in ids]
        assert len({e.event_id for _, e in logged}) == len(logged), "an event twice"
        # C12 first: one effect per executed call and per key, whatever the log shows.
        effects = [e for e in gate.effects() if e["invocation_id"] in ids]
        executed = {p.invocation_id for p in plan if p.expect == "executed" and p.key}
        per_call = Counter(e["invocation_id"] for e in effects)
        assert set(per_call) == executed and set(per_call.values()) == {1}, per_call
        keys = Counter(
            (by_id[e["invocation_id"]].tenant, by_id[e["invocation_id"]].key) for e in effects
        )
        assert set(keys.values()) == {1}

        distinct = {e.event_id: e for _, e in logged}.values()
        events = Counter((e.invocation_id, e.event_type) for e in distinct)
        twice = {k: n for k, n in events.items() if k[1] in ONCE and n > 1}
        chains = {
            inv: [
                (e.event_type, e.event_id[:12], (e.causation_id or "")[:12], r.offset)
                for r, e in logged
                if e.invocation_id == inv
            ]
            for inv, *_ in twice
        }
        assert not twice, (twice, chains)

        assert set(audited().values()) == {1}
        assert gate.verify_audit().ok and replay(gate)["equal"]
    finally:
        gate.close()
