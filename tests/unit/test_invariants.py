"""Safety invariants of the contract under arbitrary interleavings (hypothesis).

A run is a random program of client inputs: proposals by several actors, tenants and
roles (with and without idempotency keys and approvals), approval decisions by various
approvers, clock advances that expire approvals, client re-sends of earlier requests
(the same event) and retries (the same call, a new invocation). Underneath, providers
time out or fail (seeded fault plans) and the executor crashes between its commit and
its provider call. The in-memory runner delivers the events with Kafka's freedom: any
interleaving of partitions (FIFO within one), and duplicate deliveries.

After every run, the log and the provider ledger must satisfy:

1. no execution without ``PolicyDecided(decision=permit)`` on the session principal of
   that invocation (C1, C3, C6);
2. no confirmed (owner / approver) and no high-impact execution without a matching
   unexpired approval by an eligible approver (C4, C5, C11);
3. an idempotency key never turns a denial into an execution or a replay (C8);
4. any change of actor, tool, target, args, policy version or dry-run snapshot
   invalidates an approval (C11; separate tests below);
5. at most one effect per execution token, per invocation and per (tenant, key) (C8,
   C12), and a token is re-executed only after a lookup found nothing (C12).
"""

from __future__ import annotations

import itertools
import json
import random
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings, target
from hypothesis import strategies as st
from tests.harness import DAY_S, Gate, write_profile

from callgate.adapters.memory import Chaos
from callgate.domain import events as ev
from callgate.domain.catalog import Profile
from callgate.providers.simulated import RefundsProvider

SELF = "<self>"

# user -> (tenant, roles)
ACTORS: dict[str, tuple[str, tuple[str, ...]]] = {
    "alice": ("acme", ("support",)),
    "amy": ("acme", ("support", "finance-approver")),
    "bob": ("acme", ("finance-approver",)),
    "rita": ("acme", ("release", "release-manager")),
    "ron": ("acme", ("release-manager",)),
    "mallory": ("acme", ()),
    "gina": ("globex", ("support", "finance-approver")),
}

CALLS: list[tuple[str, dict[str, Any]]] = [
    ("tickets.read", {"ticket_id": "T-1"}),
    ("tickets.read", {"ticket_id": "GT-1"}),
    ("tickets.create", {"title": "t", "requester_id": SELF}),
    ("tickets.create", {"title": "t", "requester_id": "alice"}),
    ("records.update", {"record_id": "REC-1", "fields": {"status": "closed"}}),
    ("refunds.issue", {"order_id": "ORD-1", "amount_cents": 500, "currency": "USD"}),
    ("refunds.issue", {"order_id": "ORD-1", "amount_cents": 700, "currency": "USD"}),
    ("refunds.issue", {"order_id": "ORD-1", "amount_cents": 20000, "currency": "USD"}),
    ("refunds.issue", {"order_id": "GORD-1", "amount_cents": 500, "currency": "USD"}),
    ("deploys.trigger", {"service": "billing", "version": "2.0.0", "environment": "staging"}),
]
KEYS = [None, "K1", "K2", "K3"]


def args_for(call: int, user: str) -> dict[str, Any]:
    _, args = CALLS[call]
    return {k: (user if v == SELF else v) for k, v in args.items()}


# --- the program -----------------------------------------------------------------------

settle = st.sampled_from([True, True, True, False])  # run to quiescence after the input
# (user, call) pairs the policy permits are drawn more often, so that programs get somewhere;
# any pair (denials, spoofs, other tenants' resources) still comes up.
PERMITTED = [
    *[("alice", c) for c in (0, 2, 3, 4, 5, 6, 7)],
    *[("amy", c) for c in (2, 4, 5, 7)],
    *[("gina", c) for c in (1, 2, 8)],
    ("rita", 9),
]
user_call = st.one_of(
    st.sampled_from(PERMITTED),
    st.sampled_from(PERMITTED),
    st.tuples(st.sampled_from(sorted(ACTORS)), st.integers(0, len(CALLS) - 1)),
)
propose_op = st.tuples(
    st.just("propose"),
    user_call,
    st.sampled_from([*KEYS, "same", "same"]),  # "same": the key of the approved invocation
    st.sampled_from(["none", "own", "own", "any"]),  # which granted approval to present
    st.integers(0, 99),
    settle,
)
decide_op = st.tuples(
    st.just("decide"),
    st.sampled_from([*sorted(ACTORS), "eligible", "eligible", "eligible"]),
    st.integers(0, 99),  # which pending approval request
    st.sampled_from(["grant", "grant", "grant", "deny"]),
    settle,
)
flow_op = st.tuples(  # propose, have it confirmed, resubmit with the approval
    st.just("flow"),
    user_call,
    st.sampled_from(KEYS),
    st.sampled_from([*sorted(ACTORS), "eligible", "eligible", "eligible", "eligible"]),
    st.sampled_from([0, 0, 0, 600_000, 1_000_000]),  # time between approval and resubmission
    settle,
)
advance_op = st.tuples(st.just("advance"), st.sampled_from([60_000, 600_000, 1_000_000]))
resend_op = st.tuples(st.just("resend"), st.integers(0, 99))  # the same event again
retry_op = st.tuples(st.just("retry"), st.integers(0, 99), settle)  # same call, new invocation
step_op = st.tuples(st.just("step"), st.integers(1, 25))
# The executor crashes at its next execution and is restarted after a few more inputs.
crash_op = st.tuples(st.just("crash"), st.sampled_from(["before", "after"]), st.integers(1, 4))
restart_op = st.tuples(st.just("restart"))

program = st.lists(
    st.one_of(
        *[propose_op] * 4,
        *[decide_op] * 2,
        *[flow_op] * 4,
        advance_op,
        resend_op,
        retry_op,
        retry_op,
        step_op,
        crash_op,
        restart_op,
    ),
    min_size=10,
    max_size=40,
)


def eligible(request: ev.ApprovalRequested) -> str:
    """Someone who may confirm ``request`` (docs/contract.md "Confirmation")."""
    if request.confirmation == "owner":
        return request.actor
    for user, (tenant, roles) in sorted(ACTORS.items()):
        mine = tenant == request.tenant and user != request.actor
        if mine and set(roles) & set(request.approver_roles):
            return user
    return request.actor


@dataclass
class Run:
    g: Gate
    tokens: dict[str, str]
    actor_of: dict[str, str] = field(default_factory=dict)  # invocation -> user
    call_of: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    sent: list[ev.Event] = field(default_factory=list)
    restart_in: int | None = None  # inputs until a crashed executor is restarted

    def approvals(self) -> list[ev.ApprovalGranted]:
        return self.g.events(ev.ApprovalGranted)

    def execute(self, op: tuple[Any, ...]) -> None:
        g, runner = self.g, self.g.runner
        if self.restart_in is not None:
            self.restart_in -= 1
            if self.restart_in < 0:
                self.restart_in = None
                runner.restart()
        match op:
            case ("propose", (user, call), key_choice, approval_choice, pick, done):
                approval, key = self._approval(user, call, approval_choice, pick)
                key = key if key_choice == "same" else key_choice
                tool, args = CALLS[call][0], args_for(call, user)
                p = g.proposal(self.tokens[user], tool, args, key=key, approval_id=approval)
                self._propose(p, user, call, key, done)
            case ("decide", user, pick, decision, done):
                closed = {
                    e.invocation_id
                    for e in g.events()
                    if isinstance(e, ev.ApprovalGranted | ev.ApprovalDenied | ev.ApprovalExpired)
                }
                open_ = [r for r in g.events(ev.ApprovalRequested) if r.invocation_id not in closed]
                if open_:
                    request = open_[pick % len(open_)]
                    who = eligible(request) if user == "eligible" else user
                    self._send(g.decision(self.tokens[who], request.invocation_id, decision), done)
            case ("flow", (user, call), key, approver, gap, done):
                tool, args = CALLS[call][0], args_for(call, user)
                p = g.proposal(self.tokens[user], tool, args, key=key)
                self._propose(p, user, call, key, True)
                (*request,) = g.events_of(p.invocation_id, ev.ApprovalRequested)
                if request:
                    who = eligible(request[0]) if approver == "eligible" else approver
                    self._send(g.decision(self.tokens[who], p.invocation_id), True)
                    granted = g.events_of(p.invocation_id, ev.ApprovalGranted)
                    approval = granted[0].approval_id if granted else None
                    runner.tick(gap)
                    again = g.proposal(self.tokens[user], tool, args, key=key, approval_id=approval)
                    self._propose(again, user, call, key, done)
            case ("advance", ms):
                runner.tick(ms)
            case ("resend", pick):
                if self.sent:
                    runner.publish(self.sent[pick % len(self.sent)])
            case ("retry", pick, done):
                sent = [e for e in self.sent if isinstance(e, ev.ToolCallProposed)]
                if sent:
                    p = sent[pick % len(sent)]
                    again = g.proposal(
                        p.session_token,
                        p.tool,
                        p.args_json,
                        key=p.idempotency_key,
                        approval_id=p.approval_id,
                    )
                    self._propose(again, *self._origin(p.invocation_id), done)
            case ("step", n):
                runner.step(n)
            case ("crash", mode, downtime):
                runner.crash_next_follow_up("invocations", mode, ev.ExecutionStarted)
                self.restart_in = downtime
            case ("restart",):
                runner.restart()
            case _:
                raise AssertionError(f"unknown operation {op!r}")

    def _propose(
        self, p: ev.ToolCallProposed, user: str, call: int, key: str | None, done: bool
    ) -> None:
        self.actor_of[p.invocation_id] = user
        self.call_of[p.invocation_id] = (call, key)
        self._send(p, done)

    def _origin(self, invocation_id: str) -> tuple[str, int, str | None]:
        call, key = self.call_of[invocation_id]
        return self.actor_of[invocation_id], call, key

    def _send(self, e: ev.Event, done: bool) -> None:
        self.sent.append(e)
        self.g.runner.publish(e)
        if done:
            self.g.runner.run()

    def _approval(
        self, user: str, call: int, choice: str, pick: int
    ) -> tuple[str | None, str | None]:
        granted = self.approvals()
        if choice == "own":
            granted = [
                a
                for a in granted
                if self.actor_of.get(a.invocation_id) == user
                and self.call_of.get(a.invocation_id, (-1, None))[0] == call
            ]
        if choice == "none" or not granted:
            return None, None
        chosen = granted[pick % len(granted)]
        return chosen.approval_id, self.call_of.get(chosen.invocation_id, (0, None))[1]


# Provider faults (seeded): timeouts before / after the effect, failures (C12).
fault_plans = st.builds(
    lambda spec, seed: {"*": spec, "seed": seed} if spec else {},
    st.sampled_from(
        [
            {},
            {},
            {"timeout_after_apply": 0.3},
            {"timeout_before_apply": 0.3},
            {"fail": 0.1, "timeout_after_apply": 0.1, "timeout_before_apply": 0.1},
            {"fail_dry_run": 0.2},
        ]
    ),
    st.integers(0, 2**16),
)


def new_gate(
    state_dir: Path, rng: random.Random, duplicate: float, faults: dict[str, Any]
) -> tuple[Gate, dict[str, str]]:
    g = Gate(state_dir, faults=faults, chaos=Chaos(rng, interleave=True, duplicate=duplicate))
    tokens = {u: g.session(u, t, roles, ttl=30 * DAY_S) for u, (t, roles) in ACTORS.items()}
    return g, tokens


# --- the invariants ----------------------------------------------------------------------


def first_positions(g: Gate) -> dict[str, int]:
    pos: dict[str, int] = {}
    for i, e in enumerate(g.runner.log.events):
        pos.setdefault(e.event_id, i)
    return pos


def check_invariants(run: Run) -> None:
    g, profile = run.g, run.g.app.profile
    pos = first_positions(g)
    decided: dict[str, ev.PolicyDecided] = {}
    for decision in g.events(ev.PolicyDecided):
        inv = decision.invocation_id
        assert inv not in decided, f"C1: two decisions for {inv}"
        decided[inv] = decision
    requested = g.events(ev.ExecutionRequested)
    rejected = {r.invocation_id for r in g.events(ev.ProposalRejected)}
    effects = g.effects()

    # 1. no execution without a permit on the session principal of that invocation
    executed = {e.invocation_id for e in requested} | {x["invocation_id"] for x in effects}
    for inv in executed:
        d = decided.get(inv)
        assert d is not None and d.decision == "permit", f"C1: {inv} ran without a permit"
        tenant, roles = ACTORS[run.actor_of[inv]]
        assert (d.actor, d.tenant, d.roles) == (run.actor_of[inv], tenant, roles), "C6"
        # ... and that permit is right: a caller role, and a resource of the session tenant
        spec = profile.tool(d.tool)
        assert spec is not None and set(roles) & set(spec.callers), f"C3: {inv} no caller role"
        owner = tenant if spec.target_arg is None else profile.owner_of(d.target)
        assert owner == tenant, f"C7: {inv} ran on another tenant's resource"
    for x in effects:
        d = decided[x["invocation_id"]]
        assert (x["tool"], x["target"], x["tenant"]) == (d.tool, d.target, d.tenant)
        assert x["args"] == json.loads(d.args_json)

    # 2. confirmed and high-impact executions carry a matching, unexpired, eligible approval
    by_token: dict[str, list[ev.ExecutionRequested]] = defaultdict(list)
    for e in sorted(requested, key=lambda e: pos[e.event_id]):
        by_token[e.execution_token].append(e)
    for runs in by_token.values():
        check_confirmation(g, profile, decided, pos, runs[0])

    # 3. a denial (or any rejection) never becomes an execution or a replay
    replays = g.events(ev.ReplayServed)
    for inv, d in decided.items():
        if d.decision == "deny":
            assert inv not in executed, f"C8: denied {inv} executed"
            assert inv not in {r.invocation_id for r in replays}, f"C8: denied {inv} replayed"
    assert not rejected & executed, "a rejected invocation executed"
    for r in replays:
        mine, original = decided[r.invocation_id], decided[r.original_invocation_id]
        assert mine.decision == "permit"
        same = ("actor", "tenant", "tool", "target", "fingerprint")
        assert [getattr(mine, f) for f in same] == [getattr(original, f) for f in same], "C8"

    # 5. at most one effect per token, per invocation and per (tenant, key)
    assert max(Counter(x["token"] for x in effects).values(), default=0) <= 1, "C12: token twice"
    assert max(Counter(x["invocation_id"] for x in effects).values(), default=0) <= 1
    per_key = Counter(
        (x["tenant"], decided[x["invocation_id"]].idempotency_key)
        for x in effects
        if decided[x["invocation_id"]].idempotency_key is not None
    )
    assert max(per_key.values(), default=0) <= 1, f"C8: a key executed twice: {per_key}"
    # ... and a token is requested again only after a lookup found nothing since the last
    reconciled = [r for r in g.events(ev.ExecutionReconciled) if not r.found]
    for token, runs in by_token.items():
        for before, after in itertools.pairwise(runs):
            between = [
                r
                for r in reconciled
                if r.execution_token == token
                and pos[before.event_id] < pos[r.event_id]
                and pos[r.event_id] < pos[after.event_id]
            ]
            assert between, f"C12: {token} re-requested without reconciliation"
            first = decided[before.invocation_id]
            again = decided[after.invocation_id]
            assert (again.fingerprint, again.tenant) == (first.fingerprint, first.tenant)


def check_confirmation(
    g: Gate,
    profile: Profile,
    decided: dict[str, ev.PolicyDecided],
    pos: dict[str, int],
    run: ev.ExecutionRequested,
) -> None:
    """Invariant 2 for the first execution of a token (retries inherit its authority)."""
    d = decided[run.invocation_id]
    if d.high_impact:
        assert d.confirmation == "approver", "C4: high impact needs an approver"
    if d.confirmation == "none":
        return
    accepted = [
        c
        for c in g.events_of(run.invocation_id, ev.ConfirmationAccepted)
        if pos[c.event_id] < pos[run.event_id]
    ]
    assert len(accepted) == 1, f"C4: {run.invocation_id} executed without a confirmation"
    (c,) = accepted
    (grant,) = [a for a in g.events(ev.ApprovalGranted) if a.approval_jti == c.approval_jti]
    assert pos[grant.event_id] < pos[c.event_id]
    assert c.occurred_at < grant.expires_at, "C11: used after expiry"
    (request,) = g.events_of(grant.invocation_id, ev.ApprovalRequested)
    binding = ("tenant", "actor", "tool", "target", "args_hash", "policy_version")
    assert [getattr(request, f) for f in binding] == [getattr(d, f) for f in binding], "C11"
    assert request.confirmation == d.confirmation
    approver_tenant, approver_roles = ACTORS[grant.approver]
    assert approver_tenant == d.tenant
    if d.confirmation == "owner":
        assert grant.approver == d.actor
    else:
        spec = profile.tool(d.tool)
        assert spec is not None
        assert set(approver_roles) & set(spec.approvers), "C4: approver without the role"
        assert grant.approver != d.actor, "C4: self-approval"
    spec = profile.tool(d.tool)
    if spec is not None and spec.require_dry_run:
        confirming = [
            r
            for r in g.events_of(run.invocation_id, ev.DryRunRecorded)
            if pos[r.event_id] < pos[run.event_id]
        ]
        assert confirming and confirming[-1].snapshot_hash == request.dry_run_hash, "C5"


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    ops=program,
    rng=st.randoms(use_true_random=False),
    duplicate=st.sampled_from([0.0, 0.3]),
    faults=fault_plans,
)
def test_safety_invariants_hold_under_any_interleaving(
    ops: list[tuple[Any, ...]], rng: random.Random, duplicate: float, faults: dict[str, Any]
) -> None:
    """Invariants 1, 2, 3 and 5 (C1, C3-C6, C8, C11, C12) over random programs, any
    partition interleaving, duplicate deliveries, provider timeouts and executor crashes."""
    with tempfile.TemporaryDirectory() as tmp:
        g, tokens = new_gate(Path(tmp), rng, duplicate, faults)
        run = Run(g, tokens)
        for op in ops:
            run.execute(op)
        g.runner.restart()  # a crashed executor comes back; everything settles
        check_invariants(run)
        executed = {e.invocation_id for e in g.events(ev.ExecutionRequested)}
        confirmed = {c.invocation_id for c in g.events(ev.ConfirmationAccepted)}
        event(f"confirmed executions: {min(len(executed & confirmed), 3)}")
        target(float(len(executed & confirmed)), label="confirmed executions")
        event(f"effects: {min(len(g.effects()), 5)}")
        event(f"replays: {min(len(g.events(ev.ReplayServed)), 3)}")


# --- 4. what invalidates an approval ---------------------------------------------------

REFUND: dict[str, Any] = {"order_id": "ORD-1", "amount_cents": 500, "currency": "USD"}

changes = st.one_of(
    st.tuples(st.just("actor"), st.sampled_from(["amy", "carl"])),
    st.tuples(st.just("amount_cents"), st.integers(1, 9999).filter(lambda a: a != 500)),
    st.tuples(st.just("order_id"), st.sampled_from(["ORD-2", "ORD-10", "ORD-1 "])),
    st.tuples(st.just("currency"), st.sampled_from(["EUR", "GBP"])),
    st.tuples(st.just("reason"), st.text(st.characters(exclude_categories=["Cs"]), max_size=20)),
    st.tuples(st.just("tool"), st.just("records.update")),
)

EXPECTED = {
    "actor": {"actor"},
    "amount_cents": {"args_hash"},
    "currency": {"args_hash"},
    "reason": {"args_hash"},
    "order_id": {"target", "args_hash"},
    "tool": {"tool", "target", "args_hash"},
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(change=changes, keyed=st.booleans())
def test_changing_actor_tool_target_or_args_invalidates_the_approval(
    change: tuple[str, Any], keyed: bool
) -> None:
    """C11 (invariant 4): any change of actor, tool, target or normalized arguments between
    approval and use is approval_mismatch naming exactly the changed bindings; no effect."""
    what, value = change
    with tempfile.TemporaryDirectory() as tmp:
        g = Gate(Path(tmp))
        alice = g.session("alice")
        key = "K" if keyed else None
        inv = g.propose(alice, "refunds.issue", REFUND, key=key)
        approval = g.approve(alice, inv)
        token, tool, args = alice, "refunds.issue", dict(REFUND)
        if what == "actor":
            token = g.session(value)
        elif what == "tool":
            tool, args = value, {"record_id": "REC-1", "fields": {"status": "x"}}
        else:
            args[what] = value
        swapped = g.propose(token, tool, args, key=key, approval_id=approval)
        assert g.outcome(swapped) == "approval_mismatch"
        assert set(g.error_details(swapped)["bindings"].split(",")) == EXPECTED[what]
        assert g.effects() == []
        # the unchanged call still runs with the same approval: only the change was refused
        done = g.propose(alice, "refunds.issue", REFUND, key=key, approval_id=approval)
        assert g.outcome(done) == "executed"
        assert len(g.effects()) == 1


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(extra=st.text(alphabet="abcdefghij ", min_size=1, max_size=12))
def test_a_new_policy_version_invalidates_the_approval(extra: str) -> None:
    """C11 (invariant 4): the approval binds the policy version. The same deployment (same
    keys, log and state) restarted with a changed policy text refuses it, naming
    policy_version."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        g = Gate(base / "state", profile=write_profile(base / "v1"))
        alice = g.session("alice")
        inv = g.propose(alice, "refunds.issue", REFUND, key="K")
        approval = g.approve(alice, inv)
        g2 = g.redeploy(write_profile(base / "v2", policy_suffix=f"// {extra}"))
        assert g2.app.profile.digest != g.app.profile.digest
        late = g2.propose(alice, "refunds.issue", REFUND, key="K", approval_id=approval)
        assert g2.outcome(late) == "approval_mismatch"
        assert g2.error_details(late)["bindings"] == "policy_version"
        assert g2.effects() == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    approved=st.integers(1, 5000),
    other=st.integers(1, 5000),
    keyed=st.booleans(),
)
def test_a_changed_dry_run_snapshot_invalidates_the_approval(
    approved: int, other: int, keyed: bool
) -> None:
    """C5, C11 (invariant 4): the approval hashes the dry-run the human saw. If the world
    changes before the call runs (another refund on the same order), the confirming
    dry-run differs: approval_mismatch naming dry_run_hash, and no second refund."""
    with tempfile.TemporaryDirectory() as tmp:
        g = Gate(Path(tmp))
        RefundsProvider.seed_order(g.app.ledger, "acme", "ORD-1", 100_000, "USD")
        alice = g.session("alice")
        mine = {**REFUND, "amount_cents": approved}
        key = "K" if keyed else None
        inv = g.propose(alice, "refunds.issue", mine, key=key)
        approval = g.approve(alice, inv)
        # meanwhile another refund on the same order runs
        theirs = {**REFUND, "amount_cents": other, "reason": "another"}
        pending = g.propose(alice, "refunds.issue", theirs, key="OTHER")
        done = g.propose(
            alice, "refunds.issue", theirs, key="OTHER", approval_id=g.approve(alice, pending)
        )
        assert g.outcome(done) == "executed"
        late = g.propose(alice, "refunds.issue", mine, key=key, approval_id=approval)
        assert g.outcome(late) == "approval_mismatch"
        assert g.error_details(late)["bindings"] == "dry_run_hash"
        assert [e["invocation_id"] for e in g.effects()] == [done]
