"""The chaos run (issue "Execution reliability, fault injection and hostile input", part 4).

``test_short_chaos_run_holds_every_check`` runs ``callgate --json chaos`` against its own
Apache Kafka broker: SIGKILLed workers, duplicate deliveries and provider
timeouts after apply, then the checks (C4, C8, C9, C12). ``test_two_instances_...`` runs
two instances on Apache Kafka and SIGKILLs whole instances (ADR 0015). The unit tests below
prove the checker itself can fail: each feeds ``verify`` evidence with one planted violation.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.harness import write_profile
from tests.kafka_support import librdkafka_lines, run_with_own_broker
from tools.chaos import Call, Evidence, Verdict, verify

from callgate.adapters.profiles import load_profile
from callgate.bootstrap import Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.catalog import Profile, default_profile_path

PROFILE: Profile = load_profile(default_profile_path())
CHAOS_ARGS = ("--proposals", "300", "--kills", "3", "--seed", "11")


def resubmitting(tmp_path: Path) -> tuple[str, str]:
    """``--profile`` of the default profile in which the flows' agents resubmit after an
    approval, as the chaos flows do (``continue_on_approval: false``, ADR 0029)."""
    return ("--profile", str(write_profile(tmp_path / "profile")))


# --- the run -------------------------------------------------------------------------------


def holds(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The figures of a chaos run whose every check held (asserted here)."""
    report = json.loads(run.stdout)  # exactly one JSON value
    figures: dict[str, Any] = report["figures"]
    assert run.returncode == 0, (report["violations"][:20], run.stderr[-3000:])
    assert not librdkafka_lines(run.stderr), librdkafka_lines(run.stderr)[:5]  # no client spam
    assert report["ok"] is True and report["violations"] == []
    assert figures["lost"] == 0
    assert figures["double effects"] == 0
    assert figures["unapproved high-impact effects"] == 0
    assert figures["conflicting outcomes"] == 0 and figures["unexpected outcomes"] == 0
    assert figures["uncertain outcomes reconciled"] == figures["uncertain outcomes"]
    assert figures["audit chain ok"] is True and figures["replay equal"] is True
    # read_committed hides a killed writer's records: nothing is seen twice
    assert figures["events seen twice, by type"] == {}
    assert figures["decisions resubmitted (not_pending)"] == 0
    # the run's limit (ADR 0079) was reached, never passed, and nothing stays reserved
    assert figures["limit refusals"] > 0 and figures["reservations leaked"] == 0
    assert figures["limit: most effects in a scope"] <= figures["limit: largest max"]
    return figures


@pytest.mark.kafka
def test_short_chaos_run_holds_every_check(tmp_path: Path) -> None:
    """300 proposals, at least 3 SIGKILLs, on the default profile (approved calls continue,
    ADR 0029; 2-of-N deploys): nothing lost, no effect twice, no unapproved high-impact
    effect, the audit chain verifies and replay equals the live views."""
    run = run_with_own_broker(tmp_path, "chaos", *CHAOS_ARGS, timeout=240)
    figures = holds(run)
    assert figures["proposals"] == 300
    assert figures["kills"] >= 3 and figures["restarts"] >= 3
    assert figures["duplicates injected"] > 0
    assert figures["high-impact effects"] > 0
    assert figures["elapsed s"] < 180


@pytest.mark.kafka
def test_a_broker_killed_and_started_again_loses_nothing(tmp_path: Path) -> None:
    """The run's broker SIGKILLed once (down 5 s, started again on its data) beside worker
    kills, callgate untouched: nothing lost, no effect twice, no unapproved high-impact
    effect, audit and replay equal, and a flow completes within the recovery bound of the
    broker's return. What the log holds twice is printed: a broker crash can leave an event
    of a transaction on the log twice (same id; every reader dedupes by id), which the run
    reports and the worker-kill run above refuses."""
    args = ("--proposals", "200", "--kills", "1", "--seed", "12", "--broker-kills", "1")
    run = run_with_own_broker(tmp_path, "chaos", *args, timeout=300)
    report = json.loads(run.stdout)
    figures = report["figures"]
    print(f"\nchaos with a broker kill: {json.dumps(figures)}")
    # Apache Kafka's (ADR 0087): a single broker's crash can drop transaction markers, so a
    # usage reservation is handled again and a limit overrun by a call. Reported, not
    # hidden; every other check must hold, and on a cluster all of them do (below).
    # Its fingerprint is an event on the log twice; only then are its consequences known.
    consequences = ("limit exceeded", "effect not reported executed")
    seen_twice = bool(figures["events seen twice, by type"])
    known = [v for v in report["violations"] if seen_twice and v.startswith(consequences)]
    others = [v for v in report["violations"] if v not in known]
    assert others == [], others[:20]
    assert run.returncode == (1 if known else 0), run.stderr[-2000:]
    assert figures["lost"] == 0 and figures["double effects"] == 0
    assert figures["unapproved high-impact effects"] == 0
    assert figures["audit chain ok"] is True and figures["replay equal"] is True
    assert figures["broker kills"] == 1
    assert float(figures["broker recovery s (max)"]) < 30
    if known:
        pytest.xfail(f"Apache Kafka drops transaction markers on one broker (ADR 0087): {known}")


@pytest.mark.kafka
@pytest.mark.timeout(480)  # the run's own bound is 420 s; the suite's default is 300 s
def test_a_cluster_loses_its_busiest_leader_and_its_controller_and_nothing_else(
    tmp_path: Path,
) -> None:
    """Three Apache Kafka nodes, topics with three replicas; two callgate instances. The
    node that leads the most partitions is SIGKILLed, then the active controller (each down
    5 s, started again on its data), beside a worker kill: every check holds, nothing is on
    the log twice (another replica leads while a node is down, so no transaction's markers
    are lost, unlike on a single broker: docs/explanation/reliability.md, "Broker kills"),
    and the flows go on during each outage. ``make chaos-cluster`` adds a node down for a
    minute."""
    args = ("--proposals", "200", "--kills", "1", "--seed", "3", "--instances", "2", "--cluster",
            "3", "--broker-kills", "2")  # fmt: skip
    run = run_with_own_broker(tmp_path, "chaos", *args, *resubmitting(tmp_path), timeout=420)
    figures = holds(run)
    print(f"\nchaos on a three-node cluster: {json.dumps(figures)}")
    assert figures["brokers"] == 3 and figures["broker kills"] == 2
    took = figures["broker kills took"]
    assert "(the busiest leader)" in took and "(the active controller)" in took, took
    costs = [float(t) for t in figures["cluster: kill to next flow done s (each)"].split(", ")]
    # What each fault cost is printed; the bound is liveness (a loaded 2-core machine runs
    # three JVMs and two instances here), not a speed target.
    assert len(costs) == 2 and all(t < 90 for t in costs), costs
    assert float(figures["broker recovery s (max)"]) < 30


@pytest.mark.kafka
def test_two_instances_on_apache_kafka_survive_instance_kills(tmp_path: Path) -> None:
    """Two instances share the partitions; two SIGKILLs of a whole instance: the other
    takes over within the session timeout and a few seconds (the takeover is measured from
    the groups' membership), the lost one comes back, and every check still holds:
    reconciliation finds effects the lost instance applied (one shared provider ledger)."""
    args = ("chaos", "--proposals", "150", "--kills", "2", "--seed", "5", "--instances", "2")
    run = run_with_own_broker(tmp_path, *args, *resubmitting(tmp_path), timeout=240)
    figures = holds(run)
    print(f"\ntwo-instance chaos on Apache Kafka: {json.dumps(figures)}")
    assert figures["instances"] == 2 and figures["instance kills"] == 2
    each = [float(t) for t in figures["takeover s (each)"].split(", ")]
    # Never less than the session timeout (6 s: the lost members must expire); seconds more.
    assert len(each) == 2 and all(5 < t < 30 for t in each), each


# --- the checker can fail ----------------------------------------------------------------


def effect(
    seq: int, inv: str, tool: str, target: str, args: Mapping[str, Any], token: str
) -> dict[str, Any]:
    return {
        "seq": seq,
        "provider": tool.split(".")[0],
        "tool": tool,
        "target": target,
        "tenant": "acme",
        "token": token,
        "invocation_id": inv,
        "args": dict(args),
        "result": {},
    }


def record(
    inv: str, tool: str, target: str, args_hash: str, approval: Any = None
) -> dict[str, Any]:
    return {
        "invocation_id": inv,
        "revision": 1,
        "proposed_by": "model",
        "authorized_by": {"principal": {"user": "alice"}, "approval": approval},
        "tool": tool,
        "target": target,
        "args_hash": args_hash,
    }


def executed(inv: str) -> dict[str, Any]:
    return {"invocation_id": inv, "outcome": "executed", "settled": True}


REFUND = {"order_id": "ORD-1", "amount_cents": 25_000, "currency": "EUR"}
BOB = {"approver": "bob", "approved_invocation_id": "p1", "jti": "apr-1"}


def clean() -> dict[str, Any]:
    """A high-impact refund approved by bob (p1 asked, p2 confirmed) and a keyed ticket."""
    return {
        "calls": {
            "p1": Call(1, "refunds.issue", "acme", "rk", frozenset({"approval_required"})),
            "p2": Call(1, "refunds.issue", "acme", "rk", frozenset({"executed"})),
            "t1": Call(2, "tickets.create", "acme", "tk", frozenset({"executed"})),
        },
        "statuses": {
            "p1": {"invocation_id": "p1", "outcome": "approval_required", "settled": True},
            "p2": executed("p2"),
            "t1": executed("t1"),
        },
        "effects": [
            effect(1, "p2", "refunds.issue", "ORD-1", REFUND, "xk-refund"),
            effect(2, "t1", "tickets.create", "", {"title": "x"}, "xk-ticket"),
        ],
        "audit": [
            record("p1", "refunds.issue", "ORD-1", "h-refund"),
            record("p2", "refunds.issue", "ORD-1", "h-refund", BOB),
            record("t1", "tickets.create", "", "h-ticket"),
        ],
        "events": [],
    }


def check(**changes: Any) -> Verdict:
    return verify(Evidence(**(clean() | changes)), PROFILE)


def test_clean_evidence_passes() -> None:
    verdict = check()
    assert verdict.violations == []
    assert verdict.figures["high-impact effects"] == 1 and verdict.figures["effects"] == 2


def test_a_token_applied_twice_is_a_double_effect() -> None:
    """C12: one execution token, one effect."""
    base = clean()
    again = effect(3, "p2", "refunds.issue", "ORD-1", REFUND, "xk-refund")
    verdict = check(effects=[*base["effects"], again])
    assert verdict.figures["double effects"] == 1
    assert any("applied twice" in v and "xk-refund" in v for v in verdict.violations)


def test_one_key_with_two_tokens_is_a_double_effect() -> None:
    """C8: at most one effect per (tenant, idempotency key), whatever token it used."""
    base = clean()
    calls = {
        **base["calls"],
        "t2": Call(2, "tickets.create", "acme", "tk", frozenset({"replayed"})),
    }
    other = effect(3, "t2", "tickets.create", "", {"title": "x"}, "xk-other")
    verdict = check(calls=calls, effects=[*base["effects"], other])
    assert verdict.figures["double effects"] == 1


@given(st.lists(st.integers(0, 50), min_size=1, max_size=20, unique=True), st.data())
def test_any_repeated_effect_is_counted(tokens: list[int], data: st.DataObject) -> None:
    """Distinct tokens and keys: no doubles; repeat any one effect: exactly one more."""
    calls = {
        f"i{t}": Call(t, "tickets.create", "acme", f"k{t}", frozenset({"executed"})) for t in tokens
    }
    effects = [
        effect(n, f"i{t}", "tickets.create", "", {}, f"xk-{t}") for n, t in enumerate(tokens)
    ]
    statuses = {i: executed(i) for i in calls}
    base = verify(Evidence(calls, statuses, effects, [], []), PROFILE)
    assert base.figures["double effects"] == 0
    copy = dict(data.draw(st.sampled_from(effects)), seq=len(effects) + 1)
    doubled = verify(Evidence(calls, statuses, [*effects, copy], [], []), PROFILE)
    assert doubled.figures["double effects"] == 1


@pytest.mark.parametrize(
    ("approval", "args_hash"),
    [
        (None, "h-refund"),  # no approval at all
        ({**BOB, "approver": "alice"}, "h-refund"),  # the actor approved themself
        (BOB, "h-other"),  # an approval granted for other arguments
    ],
)
def testunapproved_high_impact_effect_is_reported(approval: Any, args_hash: str) -> None:
    """C4, C9: a refund of 250.00 needs an approver other than the actor, for this call."""
    base = clean()
    audit = [r for r in base["audit"] if r["invocation_id"] != "p2"]
    audit.append(record("p2", "refunds.issue", "ORD-1", args_hash, approval))
    verdict = check(audit=audit)
    assert verdict.figures["unapproved high-impact effects"] == 1
    assert any("without a matching approval" in v for v in verdict.violations)


def test_a_low_impact_refund_needs_no_approver() -> None:
    base = clean()
    small = {**REFUND, "amount_cents": 9_999}
    effects = [effect(1, "p2", "refunds.issue", "ORD-1", small, "xk-refund"), base["effects"][1]]
    audit = [
        *base["audit"][:1],
        record("p2", "refunds.issue", "ORD-1", "h-refund"),
        base["audit"][2],
    ]
    assert check(effects=effects, audit=audit).violations == []


def test_a_proposal_without_a_settled_status_is_lost() -> None:
    base = clean()
    statuses = dict(base["statuses"])
    del statuses["t1"]
    statuses["p2"] = {"invocation_id": "p2", "outcome": "allowed", "settled": False}
    verdict = check(statuses=statuses)
    assert verdict.figures["lost"] == 2


def test_an_unexpected_outcome_and_an_unreported_effect_are_reported() -> None:
    base = clean()
    statuses = {
        **base["statuses"],
        "t1": {"invocation_id": "t1", "outcome": "outcome_uncertain", "settled": True},
    }
    verdict = check(statuses=statuses)
    assert verdict.figures["unexpected outcomes"] == 1
    assert verdict.figures["effects not reported executed"] == 1


def _event(cls: type[ev.Event], inv: str, n: int, **fields: Any) -> ev.Event:
    return cls(event_id=f"e{n}", invocation_id=inv, partition_key="k-1", **fields)


def test_two_terminal_outcomes_for_one_invocation_are_reported() -> None:
    """Exactly one terminal outcome; the one change allowed is uncertain -> executed (C12)."""
    reconciled = [
        _event(ev.ExecutionUncertain, "t1", 1, execution_token="xk-ticket", reason="timeout"),
        _event(
            ev.ExecutionReconciled,
            "t1",
            2,
            execution_token="xk-ticket",
            found=True,
            result_json="{}",
            original_invocation_id="t1",
        ),
    ]
    verdict = check(events=reconciled)
    assert verdict.figures["conflicting outcomes"] == 0
    assert verdict.figures["uncertain outcomes reconciled"] == 1
    both = [
        _event(ev.ExecutionSucceeded, "t1", 1, execution_token="xk-ticket", result_json="{}"),
        _event(ev.ExecutionFailed, "t1", 2, execution_token="xk-ticket", message="boom"),
    ]
    verdict = check(events=both)
    assert verdict.figures["conflicting outcomes"] == 1
    assert any("more than one terminal outcome" in v for v in verdict.violations)


def test_a_continued_approval_is_one_outcome_only_where_the_tool_continues(
    tmp_path: Path,
) -> None:
    """ADR 0029: for a tool that continues once approved, ``approval_required`` is a waypoint
    on the way to the continued call's outcome; where the tool does not continue, the same
    log gives two terminal outcomes for one invocation."""
    asked = ev.ApprovalRequested(
        event_id="e1",
        invocation_id="p1",
        partition_key="k-1",
        tenant="acme",
        actor="alice",
        tool="refunds.issue",
        target="ORD-1",
        args_json="{}",
        args_hash="h-refund",
        dry_run_json="{}",
        dry_run_hash="d",
        policy_version="v",
        confirmation="approver",
        approver_roles=("finance-approver",),
        expires_at=0,
    )
    ran = _event(ev.ExecutionSucceeded, "p1", 2, execution_token="xk-refund", result_json="{}")
    continuing = check(events=[asked, ran])
    assert continuing.figures["conflicting outcomes"] == 0
    no_continuation = load_profile(write_profile(tmp_path / "profile"))
    two = verify(Evidence(**(clean() | {"events": [asked, ran]})), no_continuation)
    assert two.figures["conflicting outcomes"] == 1
    assert any("more than one terminal outcome: p1" in v for v in two.violations)


def test_an_uncertain_mutation_never_reconciled_is_reported() -> None:
    uncertain = [_event(ev.ExecutionUncertain, "t1", 1, execution_token="xk-ticket", reason="t")]
    verdict = check(events=uncertain)
    assert verdict.figures["uncertain outcomes not reconciled"] == 1


def test_an_agents_uncertain_read_outside_the_run_is_a_read() -> None:
    """An agent's call through the command line (chaos --network) is not among the run's
    calls: its tool is the one the log requested, so an uncertain read is not counted as a
    mutation left unreconciled, and an uncertain mutation still is."""
    read = [
        _event(ev.ExecutionRequested, "a1", 1, tenant="acme", tool="tickets.read",
               target="T-1", args_json="{}", execution_token="xi-read", actor="alice"),
        _event(ev.ExecutionUncertain, "a1", 2, execution_token="xi-read", reason="t"),
    ]  # fmt: skip
    verdict = check(events=read)
    assert verdict.figures["uncertain outcomes not reconciled"] == 0
    assert verdict.figures["uncertain reads (retried as new reads)"] == 1
    create = [
        _event(ev.ExecutionRequested, "a2", 3, tenant="acme", tool="tickets.create",
               target="", args_json="{}", execution_token="xi-create", actor="alice"),
        _event(ev.ExecutionUncertain, "a2", 4, execution_token="xi-create", reason="t"),
    ]  # fmt: skip
    assert check(events=create).figures["uncertain outcomes not reconciled"] == 1


# --- a bug the chaos run found -------------------------------------------------------------


@pytest.mark.parametrize(
    ("faults", "crash", "answer_type"),
    [
        ({}, False, ev.ExecutionSucceeded),
        ({"tickets": {"timeout_after_apply": 1.0}}, False, ev.ExecutionUncertain),
        ({}, True, ev.ExecutionReconciled),  # the executor died before calling the provider
    ],
)
def test_a_repeated_execution_request_gets_the_recorded_answer(
    tmp_path: Path, faults: dict[str, Any], crash: bool, answer_type: type[ev.Event]
) -> None:
    """C12: a run executes at most once whatever delivers its request twice (ADR 0062).
    Given a finished run, when the same request arrives again, then the executor re-emits
    the recorded outcome and runs nothing."""
    app = bootstrap(Settings(state_dir=tmp_path, faults=faults, dev=True))
    executor = app.executor()
    request = ev.ExecutionRequested(
        event_id="req-1",
        invocation_id="inv-1",
        partition_key="k-1",
        tenant="acme",
        tool="tickets.create",
        target="",
        args_json=json.dumps({"title": "t", "requester_id": "alice"}),
        execution_token="xk-1",
        attempt=1,
    )
    state, outputs = executor.handle(executor.initial_state(), request, 1_000)
    started = [e for e in outputs if isinstance(e, ev.Event)]
    assert [type(e) for e in started] == [ev.ExecutionStarted]
    if crash:
        state, answer = executor.recover(executor.load_state(executor.dump_state(state)), 1_500)
    else:
        state, answer = executor.follow_up(state, started, 1_001)
    assert [type(e) for e in answer] == [answer_type]
    effects = len(app.ledger.effects())
    state = executor.load_state(executor.dump_state(state))  # as restored from the changelog
    state, again = executor.handle(state, request, 2_000)
    assert list(again) == list(answer)
    assert len(app.ledger.effects()) == effects == (0 if crash else 1)
    state, more = executor.follow_up(state, [e for e in again if isinstance(e, ev.Event)], 2_001)
    assert list(more) == [] and len(app.ledger.effects()) == effects


@pytest.mark.parametrize("presents_approval", [True, False], ids=["with-approval", "key-only"])
def test_a_retry_that_runs_an_approved_call_names_its_approval(
    tmp_path: Path, presents_approval: bool
) -> None:
    """C4, C9, C12, found by the chaos run (faults before apply): the confirmed refund timed
    out before its effect; the retry under the same key reconciles (nothing applied) and
    executes it. The effect is the retry's, so the retry's audit record must name the
    approval that authorizes it (bob's), not none."""
    from tests.harness import Gate

    g = Gate(tmp_path / "state", faults={"refunds": {"timeout_before_apply": 1.0, "first_n": 1}})
    alice, bob = g.session("alice"), g.session("bob", roles=("finance-approver",))
    pending = g.propose(alice, "refunds.issue", REFUND, key="K")
    approval = g.approve(bob, pending)
    first = g.propose(alice, "refunds.issue", REFUND, key="K", approval_id=approval)
    assert g.outcome(first) == "outcome_uncertain" and g.effects() == []
    again = {"approval_id": approval} if presents_approval else {}
    retry = g.propose(alice, "refunds.issue", REFUND, key="K", **again)
    assert g.outcome(retry) == "executed"
    (applied,) = g.effects()
    assert applied["invocation_id"] == retry
    record = g.audit(retry)[-1]
    assert record["authorized_by"]["approval"]["approver"] == "bob"
    assert record["authorized_by"]["approval"]["approved_invocation_id"] == pending
    audit = [r for i in (pending, first, retry) for r in g.audit(i)]
    assert _unapproved(applied, audit) == []


def _unapproved(applied: Mapping[str, Any], audit: list[dict[str, Any]]) -> list[str]:
    from tools.chaos import unapproved_high_impact

    return unapproved_high_impact([applied], audit, PROFILE)


def test_two_lookups_of_one_attempt_retry_it_once(tmp_path: Path) -> None:
    """C12, found by the chaos run: after the executor restarted mid-run, its recovery and a
    retry's ReconciliationRequested both looked up attempt 1 and found nothing; each answer
    started a retry (a second effect, or a call left executing forever). Given one retry
    per attempt, the second answer does nothing; a lookup of the retry's own started attempt
    (the executor died again) still retries."""
    from callgate.domain.canonical import partition_key
    from callgate.domain.scope import bound_id

    app = bootstrap(Settings(state_dir=tmp_path, dev=True))
    decider = app.decider()
    token = app.session_issuer.issue("alice", "acme", ["support"], 1_000, ttl_seconds=3600)
    P1, P2 = bound_id(token, "p1"), bound_id(token, "p2")  # as the SDK binds ids
    pk = partition_key("acme", "K", P1)
    args = json.dumps({"title": "t", "requester_id": "alice"})
    n = iter(range(100))

    def proposal(inv: str) -> ev.ToolCallProposed:
        return ev.ToolCallProposed(
            event_id=f"req-{inv}",
            invocation_id=inv,
            partition_key=pk,
            session_token=token,
            tool="tickets.create",
            args_json=args,
            idempotency_key="K",
        )

    def feed(state: Any, event: ev.Event) -> tuple[Any, list[ev.Event]]:
        state, out = decider.handle(state, event, 2_000)
        return state, [e for e in out if isinstance(e, ev.Event)]

    def answer(cls: type[ev.Event], inv: str, **fields: Any) -> ev.Event:
        return cls(event_id=f"x{next(n)}", invocation_id=inv, partition_key=pk, **fields)

    state, out = feed(decider.initial_state(), proposal(P1))
    (request,) = [e for e in out if isinstance(e, ev.ExecutionRequested)]
    xt = request.execution_token
    state, _ = feed(state, answer(ev.ExecutionStarted, P1, execution_token=xt, attempt=1))
    state, _ = feed(state, answer(ev.ExecutionUncertain, P1, execution_token=xt, reason="t"))
    state, out = feed(state, proposal(P2))  # the agent retries: it waits, reconciled first
    assert [type(e) for e in out] == [
        ev.PolicyDecided,
        ev.ReplayAwaited,
        ev.ReconciliationRequested,
    ]
    nothing = {"execution_token": xt, "found": False, "original_invocation_id": P1}
    state, out = feed(state, answer(ev.ExecutionReconciled, P1, **nothing))  # recover
    retries = [e for e in out if isinstance(e, ev.ExecutionRequested)]
    assert [(e.invocation_id, e.attempt) for e in retries] == [(P2, 2)]
    state, out = feed(state, answer(ev.ExecutionReconciled, P2, **nothing))  # the lookup
    assert out == []
    # attempt 2 started, then the executor died: its recovery's lookup retries attempt 2
    state, _ = feed(state, answer(ev.ExecutionStarted, P2, execution_token=xt, attempt=2))
    again = {**nothing, "original_invocation_id": P2}
    state, out = feed(state, answer(ev.ExecutionReconciled, P2, **again))
    assert [(e.invocation_id, e.attempt) for e in out if isinstance(e, ev.ExecutionRequested)] == [
        (P2, 3)
    ]


@pytest.mark.kafka
def test_a_store_ahead_of_the_committed_bound_is_restored_from_the_log(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A store never leads the broker's committed changelog bound on Apache Kafka (it is
    applied after the commit), so one that does is another world's: it is wiped and
    restored from the log up to the bound."""
    import uuid

    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic

    from callgate.adapters.kafka.client import make_producer
    from callgate.adapters.kafka.state import ChangelogReader, PartitionStore, restore_partition

    topic = f"chaos-restore-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    config = {"cleanup.policy": "compact", "retention.ms": "-1"}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(30)
    producer = make_producer(kafka_bootstrap)
    for value, token, prev in ((b"v1", b"t1", b""), (b"v2", b"t2", b"t1")):
        headers: list[tuple[str, str | bytes | None]] = [("cg-txn", token), ("cg-prev", prev)]
        producer.produce(topic, key=b"k", value=value, partition=0, headers=headers)
    assert producer.flush(30) == 0
    store = PartitionStore(tmp_path / "p0", topic)
    store.apply({"k": b"v2"}, 2, "elsewhere")
    reader = ChangelogReader(kafka_bootstrap, timeout_s=30)
    try:
        restore_partition(store, reader, 0, bound=1)  # the broker's bound: only t1 committed
    finally:
        reader.close()
    assert (store.offset, store.head, store.get("k")) == (1, "t1", b"v1")
    store.close()


# --- usage limits (ADR 0079) --------------------------------------------------------------


def _asked(inv: str, n: int) -> ev.Event:
    return ev.UsageReserveRequested(
        event_id=f"a{n}", invocation_id=inv, partition_key="u-scope", limit="one-ticket",
        reservation_id=f"r-{inv}", amount=1, limit_max=1, window_ms=3_600_000, over="refuse",
        reply_key="k-1", tool="tickets.create", scope_json="{}",
    )  # fmt: skip


def _reserved(inv: str, n: int) -> ev.Event:
    return ev.UsageReserved(
        event_id=f"b{n}", invocation_id=inv, partition_key="k-1", limit="one-ticket",
        reservation_id=f"r-{inv}", scope_key="u-scope", amount=1, used=0, limit_max=1,
        window_ms=3_600_000, over_limit=False,
    )  # fmt: skip


def _committed(inv: str, n: int) -> ev.Event:
    return ev.UsageCommitted(
        event_id=f"c{n}", invocation_id=inv, partition_key="u-scope", limit="one-ticket",
        reservation_id=f"r-{inv}", window_ms=3_600_000,
    )  # fmt: skip


def test_a_limit_kept_passes() -> None:
    verdict = check(events=[_asked("t1", 1), _reserved("t1", 1), _committed("t1", 1)])
    assert verdict.violations == []
    assert verdict.figures["limit: most effects in a scope"] == 1
    assert verdict.figures["reservations leaked"] == 0


def test_a_limit_passed_is_reported() -> None:
    """Two effects in a scope whose limit is one: the verdict fails, naming the scope."""
    events = [
        *(f(inv, n) for n, inv in enumerate(("t1", "p2")) for f in (_asked, _reserved)),
        _committed("t1", 1),
        _committed("p2", 2),
    ]
    verdict = check(events=events)
    assert [v for v in verdict.violations if v.startswith("limit exceeded")] == [
        "limit exceeded: one-ticket in u-scope: committed 2, effects 2 > 1"
    ]


def test_a_reservation_never_settled_is_leaked() -> None:
    verdict = check(events=[_asked("t1", 1), _reserved("t1", 1)])
    assert verdict.violations == ["reservation leaked (neither committed nor released): r-t1"]


def test_a_lookup_that_fails_leaves_the_key_to_the_next_retry(tmp_path: Path) -> None:
    """C12, found by the network chaos run: a retry's reconciliation whose lookup failed (a
    connection reset to the provider) was answered ``outcome_uncertain``, and the key stayed
    ``reconciling``: every later retry under it waited forever. Now the next call waiting on
    the key asks again, and with none waiting the next retry does; once a lookup answers,
    the call runs once more, for that retry."""
    from callgate.domain.canonical import partition_key
    from callgate.domain.scope import bound_id

    app = bootstrap(Settings(state_dir=tmp_path, dev=True))
    decider = app.decider()
    token = app.session_issuer.issue("alice", "acme", ["support"], 1_000, ttl_seconds=3600)
    P1, P2, P3, P4 = (bound_id(token, f"p{i}") for i in range(1, 5))
    pk = partition_key("acme", "K", P1)
    args = json.dumps({"title": "t", "requester_id": "alice"})
    n = iter(range(100))

    def proposal(inv: str) -> ev.ToolCallProposed:
        return ev.ToolCallProposed(
            event_id=f"req-{inv}", invocation_id=inv, partition_key=pk, session_token=token,
            tool="tickets.create", args_json=args, idempotency_key="K",
        )  # fmt: skip

    def feed(state: Any, event: ev.Event) -> tuple[Any, list[ev.Event]]:
        state, out = decider.handle(state, event, 2_000)
        return state, [e for e in out if isinstance(e, ev.Event)]

    def answer(cls: type[ev.Event], inv: str, **fields: Any) -> ev.Event:
        return cls(event_id=f"x{next(n)}", invocation_id=inv, partition_key=pk, **fields)

    def lookups(out: list[ev.Event]) -> list[str]:
        return [e.invocation_id for e in out if isinstance(e, ev.ReconciliationRequested)]

    state, out = feed(decider.initial_state(), proposal(P1))
    (request,) = [e for e in out if isinstance(e, ev.ExecutionRequested)]
    xt = request.execution_token
    state, _ = feed(state, answer(ev.ExecutionStarted, P1, execution_token=xt, attempt=1))
    state, _ = feed(state, answer(ev.ExecutionUncertain, P1, execution_token=xt, reason="reset"))
    state, out = feed(state, proposal(P2))  # the agent retries: reconcile first
    assert lookups(out) == [P2]
    state, out = feed(state, proposal(P3))  # another retry while the lookup runs: it waits
    assert lookups(out) == []
    failed = {"execution_token": xt, "reason": "crm GET /lookup: connection reset"}
    state, out = feed(state, answer(ev.ExecutionUncertain, P2, **failed))
    assert lookups(out) == [P3]  # P2 is answered uncertain; the next waiter asks again
    state, out = feed(state, answer(ev.ExecutionUncertain, P2, **failed))  # delivered twice
    assert out == []
    state, out = feed(state, answer(ev.ExecutionUncertain, P3, **failed))
    assert out == []  # nobody waits any more: the key is uncertain again
    state, out = feed(state, proposal(P4))  # a later retry is not left waiting
    assert lookups(out) == [P4]
    nothing = {"execution_token": xt, "found": False, "original_invocation_id": P1}
    state, out = feed(state, answer(ev.ExecutionReconciled, P4, **nothing))
    runs = [(e.invocation_id, e.attempt) for e in out if isinstance(e, ev.ExecutionRequested)]
    assert runs == [(P4, 2)]
