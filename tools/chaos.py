"""``python -m tools chaos``: the Kafka pipeline under SIGKILL, duplicate delivery and
provider timeouts.

Issue "Execution reliability, fault injection and hostile input", part 4. One run:

1. its own broker (Apache Kafka from Maven,
   ``tools.apache_kafka``; none with ``--bootstrap-servers``), a fresh state
   directory and topic prefix, and ``--instances`` instances of ``callgate serve``'s
   ``Supervisor`` (ids ``chaos-0``, ``chaos-1``, ...; one state directory, as instances of
   one deployment share its keys and the simulated providers' ledger) with one worker child
   per process each; the simulated providers time out after applying 5% of effects and
   before applying 3%, so outcomes become ``outcome_uncertain`` and must be reconciled (C12);
2. ``proposals`` flows driven concurrently, as an agent platform and approval UIs would:
   reads, keyed ticket creations (with replays and conflicting reuse, C8), owner-confirmed
   record updates and refunds (approve, then confirm, C5), high-impact refunds, deploys and
   user deletions confirmed by an approver (C4, C11), some denied, forbidden calls, identity
   spoofs (C6) and bad sessions. A fraction of all input events is published twice
   (duplicate delivery); a call that ends ``outcome_uncertain`` is resubmitted with the same
   key and arguments until it settles (C12);
3. meanwhile at least ``kills`` SIGKILLs at random moments, and ``broker_kills`` SIGKILLs
   of the run's own broker (its JVM), which stays down ``broker_down_s`` and is started
   again on its data: nothing of callgate is touched, its workers recover by themselves
   (docs/contract.md, "Kafka client errors"); the time from the broker's return to the
   next flow done is reported. One instance: of a random worker
   child (decider, executor or a projection), which the supervisor restarts. Several
   instances: of a whole random instance (every child at once, as a lost host), which stays
   down until the others own all its partitions (the takeover, timed from the SIGKILL and
   reported; ADR 0015), then comes back;
4. the verdict (``verify``): every proposal has exactly one terminal outcome, the expected
   one; no effect applied twice (token, or tenant and idempotency key); no high-impact
   effect without an approval by someone other than the actor for that exact call; every
   effect reported ``executed``; the audit chain verifies against its heads; ``replay``
   equals the live views; nothing lost. Exit 0 only if all hold within the time limit.

Usage limits (ADR 0079): the run's profile is the default one with a limit of
``0.3 * proposals`` ticket creations per actor per day. ``budget`` flows spend one actor's
(``lena``) in bursts of ``BURST`` keyed creations, far past it, so the limit refuses calls
while instances die; alice's own creations stay well below it. The verdict reads the log:
no scope ever committed more than its limit, no effect beyond it, and every reservation
was committed or released once all settled (none leaked).
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import random
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from confluent_kafka import ConsumerGroupState
from rich.table import Table

from callgate.adapters.kafka.client import make_admin
from callgate.adapters.kafka.serve import Supervisor, create_topics, worker_env
from callgate.adapters.kafka.topics import Topics
from callgate.application.answers import is_final
from callgate.application.replay import replay
from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.catalog import Profile, default_profile_path
from callgate.domain.codes import TERMINAL, Code
from callgate.domain.scope import OPERATOR_ROLE, bound_id
from callgate.surfaces.render import Renderer
from callgate.surfaces.sdk import Gateway
from callgate_projections.audit import VerifyResult
from callgate_projections.status import outcome_for, subject_of
from tools.apache_kafka import ApacheKafka, KafkaUnavailable
from tools.kafka_cluster import KafkaCluster

# Every simulated provider times out after applying 5% of effects and before applying 3%
# (C12: reconciliation finds the effect, or finds nothing and the retry runs it); latency
# widens the window between an effect and the commit of its outcome, where a SIGKILL of
# the executor hurts most.
FAULTS: dict[str, Any] = {
    "*": {"timeout_after_apply": 0.05, "timeout_before_apply": 0.03, "latency_ms": 3},
}
DUPLICATE_RATE = 0.10  # input events published twice
WINDOW = 200  # flows in flight at once: enough to keep every worker busy
STEP_TIMEOUT_S = 240.0  # one step (a proposal settling, a decision answered)
MAX_RETRIES = 8  # resubmissions of one call that stays outcome_uncertain
MIN_KILL_GAP_S = 2.0
# Group settings: they bound the takeover of a lost instance (ADR 0015).
WORKER_ARGS = ("-X", "session.timeout.ms=6000", "-X", "heartbeat.interval.ms=500")
TAKEOVER_LIMIT_S = 60.0  # a lost instance's partitions must move within this
BROKER_RECOVERY_LIMIT_S = 30.0  # a flow done within this of the broker's return
UP_BEFORE_KILL_S = 3.0  # an instance kill waits until every instance has been up this long
KINDS: tuple[tuple[str, float], ...] = (
    ("read", 0.23),
    ("budget", 0.05),
    ("create", 0.20),
    ("record", 0.12),
    ("refund_owner", 0.06),
    ("refund_high", 0.12),
    ("deploy", 0.03),
    ("user_delete", 0.03),
    ("forbidden", 0.07),
    ("spoof", 0.06),
    ("unauthenticated", 0.03),
)
VOCABULARY = frozenset(c.value for c in Code)
EXECUTED, REPLAYED = Code.EXECUTED.value, Code.REPLAYED.value
UNCERTAIN = Code.OUTCOME_UNCERTAIN.value
LIMITED = Code.LIMIT_EXCEEDED.value
LIMIT_NAME = "chaos-creations"
LIMIT_SHARE = 0.3  # of the proposals: alice's creations (a fifth of the flows) stay below
BURST = 12  # creations of one budget flow, one after the other
BUDGET_EVERY = 4  # the flows that pass the limit come first, one in this many (pick_kind)
DONE = frozenset({EXECUTED, REPLAYED})


@dataclass(frozen=True)
class Call:
    """One published proposal: what it asked and which final outcomes are correct."""

    flow: int
    tool: str
    tenant: str
    key: str | None
    expect: frozenset[str]


@dataclass(frozen=True)
class Evidence:
    """Everything the verdict reads, gathered after the run (``verify`` is pure)."""

    calls: Mapping[str, Call]  # every proposal published, by invocation id
    statuses: Mapping[str, Mapping[str, Any]]  # the live status view
    effects: Sequence[Mapping[str, Any]]  # the providers' effect ledger
    audit: Sequence[Mapping[str, Any]]  # the live audit view
    events: Sequence[ev.Event]  # the authoritative events log
    flow_failures: Sequence[str] = ()


@dataclass
class Verdict:
    figures: dict[str, int] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)


def verify(e: Evidence, profile: Profile) -> Verdict:
    """The chaos run's checks (C4, C8, C9, C12): the run passes only with no violations."""
    v = Verdict()
    lost = [i for i in e.calls if not (e.statuses.get(i) or {}).get("settled")]
    bad_code = [i for i in e.calls if i not in lost and e.statuses[i]["outcome"] not in VOCABULARY]
    unexpected = [
        f"{i}: {e.statuses[i]['outcome']} not in {sorted(c.expect)}"
        for i, c in e.calls.items()
        if i not in lost and e.statuses[i]["outcome"] not in c.expect
    ]
    v.figures["lost"] = len(lost) + len(bad_code)
    conflicting = _conflicting_outcomes(e.events, e.calls, profile)
    v.figures["conflicting outcomes"] = len(conflicting)
    v.figures["unexpected outcomes"] = len(unexpected) + len(e.flow_failures)
    doubles, unknown = _double_effects(e.effects, e.calls)
    v.figures["double effects"] = len(doubles)
    v.figures["effects of unknown calls"] = len(unknown)
    unapproved = unapproved_high_impact(e.effects, e.audit, profile)
    v.figures["unapproved high-impact effects"] = len(unapproved)
    unreported = [
        f"effect {x['seq']} of {x['invocation_id']}: status "
        f"{(e.statuses.get(x['invocation_id']) or {}).get('outcome')}"
        for x in e.effects
        if (e.statuses.get(x["invocation_id"]) or {}).get("outcome") != EXECUTED
    ]
    v.figures["effects not reported executed"] = len(unreported)
    uncertain, reads = _uncertain(e.events, e.calls, profile)
    reconciled = {x.execution_token for x in e.events if isinstance(x, ev.ExecutionReconciled)}
    unreconciled = sorted(uncertain - reconciled)
    v.figures["uncertain outcomes"] = len(uncertain)
    v.figures["uncertain outcomes reconciled"] = len(uncertain & reconciled)
    v.figures["uncertain outcomes not reconciled"] = len(unreconciled)
    v.figures["uncertain reads (retried as new reads)"] = len(reads)
    overspent, leaked = _limits(e, v)
    v.figures["effects"] = len(e.effects)
    v.figures["high-impact effects"] = sum(1 for x in e.effects if _high(x, profile))
    for label, items in (
        ("lost (no settled status)", lost),
        ("outcome outside the vocabulary", bad_code),
        ("more than one terminal outcome", conflicting),
        ("unexpected outcome", unexpected),
        ("flow failed", list(e.flow_failures)),
        ("effect applied twice", doubles),
        ("effect of a call nobody proposed", unknown),
        ("high-impact effect without a matching approval", unapproved),
        ("effect not reported executed", unreported),
        ("uncertain mutation never reconciled (C12), token", unreconciled),
        ("limit exceeded", overspent),
        ("reservation leaked (neither committed nor released)", leaked),
    ):
        v.violations += [f"{label}: {item}" for item in items]
    return v


def _limits(e: Evidence, v: Verdict) -> tuple[list[str], list[str]]:
    """Usage limits, from the log (ADR 0079): per scope, what was committed and the effects
    of the calls that reserved there never pass the limit; every reservation answered
    ``UsageReserved`` was committed or released. Returns the scopes over their limit and the
    reservations leaked."""
    asked: dict[str, ev.UsageReserveRequested] = {}
    by_call: dict[str, list[ev.UsageReserveRequested]] = {}
    reserved: set[str] = set()
    settled: set[str] = set()
    committed: Counter[str] = Counter()
    committed_ids: set[str] = set()
    for x in e.events:
        if isinstance(x, ev.UsageReserveRequested):
            asked[x.reservation_id] = x
            by_call.setdefault(x.invocation_id, []).append(x)
        elif isinstance(x, ev.UsageReserved):
            reserved.add(x.reservation_id)
        elif isinstance(x, ev.UsageReleased):
            settled.add(x.reservation_id)
        elif isinstance(x, ev.UsageCommitted) and x.reservation_id not in committed_ids:
            committed_ids.add(x.reservation_id)
            settled.add(x.reservation_id)
            if x.reservation_id in asked:
                committed[x.reservation_id] = asked[x.reservation_id].amount
    spent: Counter[str] = Counter()  # scope -> committed amount (the run is inside a window)
    effects: Counter[str] = Counter()  # scope -> amount of the effects applied
    maxima: dict[str, tuple[str, int]] = {}
    for rid, amount in committed.items():
        spent[asked[rid].partition_key] += amount
    for r in asked.values():
        maxima[r.partition_key] = (r.limit, r.limit_max)
    for applied in e.effects:
        for r in by_call.get(str(applied["invocation_id"]), ()):
            effects[r.partition_key] += r.amount
    over = [
        f"{limit} in {scope}: committed {spent[scope]}, effects {effects[scope]} > {most}"
        for scope, (limit, most) in sorted(maxima.items())
        if max(spent[scope], effects[scope]) > most
    ]
    leaked = sorted(reserved - settled)
    v.figures["limit scopes"] = len(maxima)
    v.figures["limit: most committed in a scope"] = max(spent.values(), default=0)
    v.figures["limit: most effects in a scope"] = max(effects.values(), default=0)
    v.figures["limit: largest max"] = max((m for _, m in maxima.values()), default=0)
    v.figures["limit refusals"] = sum(1 for s in e.statuses.values() if s.get("outcome") == LIMITED)
    v.figures["reservations"] = len(reserved)
    v.figures["reservations leaked"] = len(leaked)
    return over, leaked


def _conflicting_outcomes(
    events: Iterable[ev.Event], calls: Mapping[str, Call], profile: Profile
) -> list[str]:
    """Invocations whose log gives more than one terminal outcome.

    The allowed changes are C12's (``outcome_uncertain`` reconciled to ``executed``) and, for
    a tool that continues once approved (ADR 0029), ``approval_required`` followed by what
    became of the continued call. The log is deduplicated by ``event_id`` (a guard:
    ``read_committed`` hides aborted records).
    """
    seen: set[str] = set()
    outcomes: dict[str, set[str]] = {}
    for event in events:
        if event.event_id in seen:
            continue
        seen.add(event.event_id)
        code = outcome_for(event)
        if code is not None and code in TERMINAL:
            outcomes.setdefault(subject_of(event), set()).add(code.value)
    for inv, found in outcomes.items():
        call = calls.get(inv)
        if len(found) > 1 and call is not None and _continues(call.tool, profile):
            found.discard(Code.APPROVAL_REQUIRED.value)
    ok = {frozenset({UNCERTAIN, EXECUTED})}
    return [
        f"{inv}: {sorted(found)}"
        for inv, found in sorted(outcomes.items())
        if len(found) > 1 and frozenset(found) not in ok
    ]


def _continues(tool: str, profile: Profile) -> bool:
    spec = profile.tool(tool)
    return spec is not None and spec.continue_on_approval


def _uncertain(
    events: Iterable[ev.Event], calls: Mapping[str, Call], profile: Profile
) -> tuple[set[str], set[str]]:
    """Execution tokens that were ``outcome_uncertain``: (mutations, reads). A read has no
    effect to reconcile; the agent simply reads again. The tool of a call the run did not
    make itself (an agent's call through the command line) is the one the log requested."""
    mutations: set[str] = set()
    reads: set[str] = set()
    requested: dict[str, str] = {}
    for x in events:
        if isinstance(x, ev.ExecutionRequested):
            requested[x.invocation_id] = x.tool
        elif isinstance(x, ev.ExecutionUncertain):
            call = calls.get(x.invocation_id)
            tool = call.tool if call is not None else requested.get(x.invocation_id)
            spec = profile.tool(tool) if tool is not None else None
            (reads if spec is not None and not spec.mutation else mutations).add(x.execution_token)
    return mutations, reads


def _double_effects(
    effects: Sequence[Mapping[str, Any]], calls: Mapping[str, Call]
) -> tuple[list[str], list[str]]:
    """Effects after the first with the same token, or the same (tenant, idempotency key)."""
    tokens: set[str] = set()
    keys: set[tuple[str, str]] = set()
    doubles: list[str] = []
    unknown: list[str] = []
    for x in sorted(effects, key=lambda x: int(x["seq"])):
        call = calls.get(x["invocation_id"])
        if call is None:
            unknown.append(f"effect {x['seq']} of {x['invocation_id']}")
        key = (str(x["tenant"]), call.key) if call is not None and call.key else None
        if x["token"] in tokens or (key is not None and key in keys):
            doubles.append(f"effect {x['seq']} ({x['tool']} {x['target']}, token {x['token']})")
        tokens.add(x["token"])
        if key is not None:
            keys.add(key)
    return doubles, unknown


def _high(effect: Mapping[str, Any], profile: Profile) -> bool:
    spec = profile.tool(str(effect["tool"]))
    return spec is None or spec.is_high_impact(effect["args"])  # unknown tool: fail closed


def unapproved_high_impact(
    effects: Sequence[Mapping[str, Any]], audit: Sequence[Mapping[str, Any]], profile: Profile
) -> list[str]:
    """C4/C9: a high-impact effect needs, on the audit record of its invocation, an approval
    by someone other than the actor, granted for a call with the same tool, target and
    normalized arguments."""
    latest: dict[str, Mapping[str, Any]] = {}
    for row in audit:
        inv = str(row.get("invocation_id"))
        if int(row.get("revision", 0)) >= int(latest.get(inv, {}).get("revision", 0)):
            latest[inv] = row
    bad: list[str] = []
    for x in effects:
        if not _high(x, profile):
            continue
        record: Mapping[str, Any] | None = latest.get(str(x["invocation_id"]))
        auth = (record or {}).get("authorized_by") or {}
        approval = auth.get("approval") or {}
        actor = (auth.get("principal") or {}).get("user")
        approved = latest.get(str(approval.get("approved_invocation_id")))
        label = f"effect {x['seq']} ({x['tool']} {x['target']}, invocation {x['invocation_id']})"
        if record is None:
            bad.append(f"{label}: no audit record")
        elif not approval.get("approver") or approval.get("approver") == actor:
            bad.append(f"{label}: approver {approval.get('approver')!r}, actor {actor!r}")
        elif approved is None or any(
            approved.get(k) != record.get(k) for k in ("tool", "target", "args_hash")
        ):
            bad.append(f"{label}: the approval was granted for another call")
    return bad


# --- the workload --------------------------------------------------------------------------


@dataclass(frozen=True)
class Who:
    user: str
    tenant: str
    token: str


@dataclass
class Wait:
    """A flow waits for a view key: a settled status, or the answer to a decision."""

    view: str
    key: str
    since: float
    after: float = 0.0  # not before this time.monotonic()
    final: bool = False  # a status: also past a granted approval that continues (ADR 0029)

    def ready(self, value: Mapping[str, Any]) -> bool:
        if time.monotonic() < self.after:
            return False
        if self.view != "status":
            return True
        return is_final(value, continues=True) if self.final else bool(value.get("settled"))


Step = Generator[Wait, dict[str, Any], dict[str, Any]]
Script = Generator[Wait, dict[str, Any], None]


@dataclass
class Counts:
    proposals: int = 0
    decisions: int = 0
    decisions_resubmitted: int = 0
    retries: int = 0


class Workload:
    """The flows, as generators that yield what they wait for (see ``propose``)."""

    def __init__(self, app: App, rng: random.Random, send: Callable[[ev.Event], None]) -> None:
        self.app, self.rng, self.send = app, rng, send
        now = app.clock()

        def who(user: str, tenant: str, *roles: str) -> Who:
            token = app.session_issuer.issue(user, tenant, list(roles), now, ttl_seconds=86_400)
            return Who(user, tenant, token)

        self.alice = who("alice", "acme", "support")
        self.bob = who("bob", "acme", "finance-approver")
        self.carol = who("carol", "acme", "admin", "release")
        self.dave = who("dave", "acme", "release-manager", "admin-approver")
        self.erin = who("erin", "acme", "release-manager")  # the second of two (ADR 0030)
        self.gina = who("gina", "globex", "support")
        self.lena = who("lena", "acme", "support")  # spends her creations' limit (budget)
        self.nobody = Who("", "acme", "not-a-session-token")
        self.calls: dict[str, Call] = {}
        self.failures: list[str] = []
        self.counts = Counts()
        self.free_slots = [
            (s, e) for s in ("billing", "checkout", "search") for e in ("staging", "production")
        ]

    def _id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128)))

    def propose(
        self,
        flow: int,
        who: Who,
        tool: str,
        args: Mapping[str, Any],
        expect: Iterable[str],
        key: str | None = None,
        approval_id: str | None = None,
    ) -> Step:
        inv = bound_id(who.token, self._id())  # bound to the session (domain/scope.py)
        self.calls[inv] = Call(flow, tool, who.tenant, key, frozenset(expect))
        self.counts.proposals += 1
        self.send(
            ev.ToolCallProposed(
                event_id=f"chaos-{inv}",
                invocation_id=inv,
                partition_key=partition_key(who.tenant, key, inv),
                correlation_id=inv,
                occurred_at=self.app.clock(),
                producer="callgate-chaos",
                session_token=who.token,
                tool=tool,
                args_json=json.dumps(dict(args)),
                idempotency_key=key,
                approval_id=approval_id,
            )
        )
        status = yield Wait("status", inv, time.monotonic())
        return status

    def run(
        self,
        flow: int,
        who: Who,
        tool: str,
        args: Mapping[str, Any],
        key: str | None,
        approval_id: str | None = None,
        also: frozenset[str] = frozenset(),
    ) -> Step:
        """Propose a call that should run; resubmit it unchanged while its outcome is
        uncertain (C12: the decider reconciles before any retry under the same key).
        ``also``: other outcomes that are correct (``limit_exceeded`` past a limit)."""
        first = {EXECUTED, UNCERTAIN} | also
        status = yield from self.propose(flow, who, tool, args, first, key, approval_id)
        for _ in range(MAX_RETRIES):
            if status["outcome"] != UNCERTAIN:
                break
            self.counts.retries += 1
            expect = {EXECUTED, REPLAYED, UNCERTAIN} | also
            status = yield from self.propose(flow, who, tool, args, expect, key, approval_id)
        return status

    def decide(self, flow: int, who: Who, status: Mapping[str, Any], decision: str) -> Step:
        """Submit a decision; wait for its answer.

        A decision answered ``not_pending`` while the status view still shows the approval
        pending (the view is a projection, a step behind the decider) is resubmitted, at most
        twice, as a UI would.
        """
        inv = str(status["invocation_id"])
        for attempt in range(3):
            submit = ev.ApprovalDecisionSubmitted(
                event_id=bound_id(who.token, f"chaos-decision-{self._id()}"),
                invocation_id=inv,
                partition_key=str(status["partition_key"]),
                correlation_id=inv,
                occurred_at=self.app.clock(),
                producer="callgate-chaos",
                session_token=who.token,
                decision=decision,
            )
            self.counts.decisions += 1
            self.send(submit)
            answer = yield Wait("decisions", submit.event_id, time.monotonic())
            if attempt == 2 or (answer.get("error") or {}).get("code") != Code.NOT_PENDING:
                break
            now = time.monotonic()
            current = yield Wait("status", inv, now, after=now + 1.0)
            if (current.get("approval") or {}).get("state") != "pending":
                break
            self.counts.decisions_resubmitted += 1
        return answer

    def want(self, flow: int, status: Mapping[str, Any], allowed: Iterable[str]) -> bool:
        if status.get("outcome") in set(allowed):
            return True
        self.failures.append(f"flow {flow}: {status.get('invocation_id')} {status.get('outcome')}")
        return False

    def confirmed(
        self, i: int, actor: Who, approver: Who, tool: str, args: Mapping[str, Any], deny: bool
    ) -> Script:
        """C5/C11: dry-run and approval_required, a decision, then the confirmed call."""
        key = f"{tool}-{i}"
        need = {Code.APPROVAL_REQUIRED.value}
        first = yield from self.propose(i, actor, tool, args, need, key)
        if not self.want(i, first, need):
            return
        answer = yield from self.decide(i, approver, first, "deny" if deny else "grant")
        if answer.get("decision") == "recorded":  # a quorum: one more, distinct approver
            answer = yield from self.decide(i, self.erin, first, "grant")
        if answer.get("decision") != ("denied" if deny else "granted"):
            self.failures.append(f"flow {i}: decision answered {answer}")
            return
        if deny:  # the key now stands for a denied call (C8)
            again = yield from self.propose(i, actor, tool, args, {"approval_denied"}, key)
            self.want(i, again, {"approval_denied"})
            return
        approval_id = str(answer["approval_id"])
        if _continues(tool, self.app.profile):  # ADR 0029: the proposal itself goes on
            inv = str(first["invocation_id"])
            self.calls[inv] = dataclasses.replace(self.calls[inv], expect=DONE)
            final = yield Wait("status", inv, time.monotonic(), final=True)
            if final.get("outcome") == UNCERTAIN:  # C12: the agent retries under its key
                # the original stays uncertain unless the retry's reconciliation finds it ran
                self.calls[inv] = dataclasses.replace(
                    self.calls[inv], expect=frozenset({EXECUTED, UNCERTAIN})
                )
                retry = {EXECUTED, REPLAYED, UNCERTAIN}
                for _ in range(MAX_RETRIES):
                    self.counts.retries += 1
                    final = yield from self.propose(i, actor, tool, args, retry, key, approval_id)
                    if final.get("outcome") != UNCERTAIN:
                        break
            elif self.want(i, final, DONE) and self.rng.random() < 0.3:
                # the agent also resubmits with the approval id: one effect, replayed (V2)
                final = yield from self.propose(i, actor, tool, args, {REPLAYED}, key, approval_id)
            self.want(i, final, DONE)
            return
        final = yield from self.run(i, actor, tool, args, key, approval_id)
        self.want(i, final, DONE)

    def script(self, i: int, kind: str) -> Script:
        rng, a = self.rng, self.alice
        args: dict[str, Any]
        if kind == "deploy" and not self.free_slots:
            kind = "user_delete"  # deploys to one service are serialized: dry-runs must match
        if kind == "read":
            s = yield from self.run(i, a, "tickets.read", {"ticket_id": f"T-{i}"}, None)
            self.want(i, s, {EXECUTED})
        elif kind == "create":
            key = f"create-{i}"
            args = {"title": f"chaos {i}", "requester_id": "alice"}
            s = yield from self.run(i, a, "tickets.create", args, key)
            if self.want(i, s, DONE) and rng.random() < 0.3:  # the agent retries (C8)
                s = yield from self.propose(i, a, "tickets.create", args, {REPLAYED}, key)
                self.want(i, s, {REPLAYED})
            if rng.random() < 0.15:  # the key reused for another call (C8)
                other = {**args, "title": f"other {i}"}
                conflict = {"idempotency_conflict"}
                s = yield from self.propose(i, a, "tickets.create", other, conflict, key)
                self.want(i, s, conflict)
        elif kind == "budget":  # past the limit: executed until it is spent, then refused
            for j in range(BURST):
                args = {"title": f"budget {i}.{j}", "requester_id": "lena"}
                s = yield from self.run(
                    i,
                    self.lena,
                    "tickets.create",
                    args,
                    f"budget-{i}-{j}",
                    also=frozenset({LIMITED}),
                )
                self.want(i, s, DONE | {LIMITED})
        elif kind == "record":
            args = {"record_id": f"REC-{i}", "fields": {"status": "closed", "note": f"n{i}"}}
            yield from self.confirmed(i, a, a, "records.update", args, deny=False)
        elif kind in ("refund_owner", "refund_high"):
            high = kind == "refund_high"
            amount = rng.randrange(10_000, 90_000) if high else rng.randrange(100, 10_000)
            args = {"order_id": f"ORD-{i}", "amount_cents": amount, "currency": "EUR"}
            deny = high and rng.random() < 0.15
            yield from self.confirmed(i, a, self.bob if high else a, "refunds.issue", args, deny)
        elif kind == "deploy":
            slot = self.free_slots.pop(rng.randrange(len(self.free_slots)))
            try:
                args = {"service": slot[0], "version": f"1.{i}.0", "environment": slot[1]}
                yield from self.confirmed(i, self.carol, self.dave, "deploys.trigger", args, False)
            finally:
                self.free_slots.append(slot)
        elif kind == "user_delete":
            args = {"user_id": f"U-{i}", "reason": "chaos"}
            yield from self.confirmed(i, self.carol, self.dave, "users.delete", args, False)
        elif kind == "forbidden":
            forbidden = {Code.TOOL_FORBIDDEN.value}
            if rng.random() < 0.5:  # support may not deploy
                args = {"service": "billing", "version": f"9.{i}", "environment": "production"}
                s = yield from self.propose(i, a, "deploys.trigger", args, forbidden)
            else:  # another tenant's ticket
                s = yield from self.propose(
                    i, self.gina, "tickets.read", {"ticket_id": "T-1"}, forbidden
                )
            self.want(i, s, forbidden)
        elif kind == "spoof":  # V1: the model names another requester
            args = {"title": f"spoof {i}", "requester_id": "mallory"}
            spoof = {"identity_spoof"}
            s = yield from self.propose(i, a, "tickets.create", args, spoof, f"spoof-{i}")
            self.want(i, s, spoof)
        else:
            unauth = {Code.UNAUTHENTICATED.value}
            s = yield from self.propose(
                i, self.nobody, "tickets.read", {"ticket_id": "T-2"}, unauth
            )
            self.want(i, s, unauth)


def limit_max(proposals: int) -> int:
    """The run's limit on one actor's creations, for a run of at most ``proposals`` flows."""
    return max(10, int(LIMIT_SHARE * proposals))


def pick_kind(rng: random.Random, i: int, proposals: int) -> str:
    """Flow ``i``'s kind in a run of at most ``proposals`` flows. Enough ``budget`` flows to
    pass the limit come first, one in every ``BUDGET_EVERY``: a run that launches fewer flows
    than planned (a slow broker holds its window full) still reaches the limit."""
    if i % BUDGET_EVERY == 0 and i // BUDGET_EVERY <= limit_max(proposals) // BURST:
        return "budget"
    return draw_kind(rng)


def draw_kind(rng: random.Random) -> str:
    """A kind drawn at its share of ``KINDS``: the same mix from the first flow to the last
    (the soak compares its first minutes with its last)."""
    roll, acc = rng.random(), 0.0
    for kind, share in KINDS:
        acc += share
        if roll < acc:
            return kind
    return KINDS[-1][0]


# --- the run -------------------------------------------------------------------------------


class ChaosSupervisor(Supervisor):
    """``callgate serve``'s supervisor, with worker logs in files and SIGKILL on demand."""

    def __init__(self, app: App, logs: Path) -> None:
        super().__init__(app, [p.name for p in app.processes()], WORKER_ARGS)
        logs.mkdir(parents=True, exist_ok=True)
        self.logs = logs
        self.env = worker_env(app.settings)
        self.spawned: dict[str, float] = {}
        self.killed: Counter[str] = Counter()
        self.down = False  # the whole instance is killed: nothing restarts until ``revive``

    def launch(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            child = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.spawned[name] = time.monotonic()
        return child

    def check(self) -> None:
        if not self.down:
            super().check()

    def up_since(self) -> float:
        """When the last child of this instance (re)started."""
        return max(self.spawned.values(), default=0.0)

    def kill_all(self) -> None:
        """SIGKILL every child at once (a lost host) and keep them down."""
        self.down = True
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
        for child in self.children.values():
            child.wait()

    def revive(self) -> None:
        """The lost instance comes back: every child starts again."""
        self.down = False
        for name in self.names:
            self.restarts += 1
            self.spawn(name)

    def kill_one(self, rng: random.Random) -> str:
        """SIGKILL a random child: the invocations process (two times in three: it holds
        C8 and C12) or a projection, preferring one that has been up for a while (a kill
        during start-up tests less)."""
        group = "invocations" if rng.random() < 2 / 3 else "projection"
        names = sorted(n for n in self.children if n == group or n.endswith(f"-{group}"))
        settled = [n for n in names if time.monotonic() - self.spawned.get(n, 0.0) > 3.0]
        name = rng.choice(settled or names)
        child = self.children[name]
        child.send_signal(signal.SIGKILL)
        child.wait()
        self.killed[name] += 1
        self.check()  # restart it now
        return name


class Fleet:
    """The instances of the run: one ``ChaosSupervisor`` each, and the kills."""

    def __init__(self, app: App, instances: int) -> None:
        self.sups: list[ChaosSupervisor] = []
        for n in range(instances):
            instance = app.settings.model_copy(update={"instance_id": f"chaos-{n}"})
            logs = app.settings.state_dir / "logs" / instance.instance_id
            self.sups.append(ChaosSupervisor(bootstrap(instance), logs))
        self.topics = Topics(app.settings.topic_prefix, app.settings.partitions)
        self.admin = make_admin(app.settings.brokers)
        self.groups = {self.topics.group(p.name): sorted(p.inputs) for p in app.processes()}
        self.process_of = {self.topics.group(p.name): p.name for p in app.processes()}
        self.takeovers: list[float] = []
        self.instance_kills = 0
        self._next_join_check = 0.0

    @property
    def restarts(self) -> int:
        return sum(s.restarts for s in self.sups)

    @property
    def killed(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for sup in self.sups:
            out.update({f"{sup.app.settings.instance_id}/{k}": v for k, v in sup.killed.items()})
        return out if len(self.sups) > 1 else self.sups[0].killed

    def start(self) -> None:
        for sup in self.sups:
            sup.start()

    def check(self) -> None:
        for sup in self.sups:
            sup.check()

    def stop(self) -> None:
        for sup in self.sups:
            sup.stop()

    def can_kill(self) -> bool:
        """Every instance up a while and, with several, owning partitions of every process
        group: a kill never finds an instance down or not joined yet."""
        now = time.monotonic()
        if not all(not s.down and now - s.up_since() > UP_BEFORE_KILL_S for s in self.sups):
            return False
        if len(self.sups) == 1:
            return True
        if now < self._next_join_check:
            return False
        self._next_join_check = now + 0.5
        ids = {s.app.settings.instance_id for s in self.sups}
        owners = self.owners()
        return owners is not None and all(found == ids for found in owners.values())

    def kill_one(self, rng: random.Random, keep_going: Callable[[], None]) -> str:
        """One instance: SIGKILL a random child. Several: SIGKILL a random instance, wait
        (calling ``keep_going`` so the flows go on) until the others own all its partitions,
        record that takeover time, and bring it back."""
        if len(self.sups) == 1:
            return self.sups[0].kill_one(rng)
        sup = rng.choice(self.sups)
        dead = sup.app.settings.instance_id
        killed_at = time.monotonic()
        sup.kill_all()
        sup.killed["instance"] += 1
        self.instance_kills += 1
        next_probe = killed_at
        while time.monotonic() - killed_at < TAKEOVER_LIMIT_S:
            keep_going()
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + 0.2
                if self.taken_over(dead):
                    self.takeovers.append(time.monotonic() - killed_at)
                    break
        sup.revive()
        return f"instance {dead}"

    def taken_over(self, dead: str) -> bool:
        """Is every process group stable, every input partition assigned, none to ``dead``?"""
        owners = self.owners()
        return owners is not None and all(dead not in found for found in owners.values())

    def owners(self) -> dict[str, set[str]] | None:
        """Per process group, the instances that own partitions; None unless every group is
        stable with every input partition assigned (a rebalance in progress, a coordinator
        moving). Members are named ``<process>.<instance>`` (``client.id``)."""
        futures = self.admin.describe_consumer_groups(list(self.groups), request_timeout=5)
        out: dict[str, set[str]] = {}
        for group, future in futures.items():
            try:
                desc = future.result()
            except Exception:  # a coordinator moving or busy: not yet
                return None
            if desc.state != ConsumerGroupState.STABLE:
                return None
            owned: set[tuple[str, int]] = set()
            out[group] = set()
            for member in desc.members:
                parts = {(tp.topic, tp.partition) for tp in member.assignment.topic_partitions}
                if parts:
                    out[group].add(member.client_id.removeprefix(f"{self.process_of[group]}."))
                owned |= parts
            wanted = {
                (self.topics.physical(t), p)
                for t in self.groups[group]
                for p in range(self.topics.partitions)
            }
            if not wanted <= owned:
                return None
        return out


class _Outbox:
    """Publishes input events once per loop pass; a fraction a second time, a bit later."""

    def __init__(self, publish: Callable[[Sequence[ev.Event]], None], rng: random.Random) -> None:
        self._publish, self._rng = publish, rng
        self._now: list[ev.Event] = []
        self._later: list[tuple[float, int, ev.Event]] = []
        self.duplicates = 0

    def send(self, event: ev.Event) -> None:
        self._now.append(event)
        if self._rng.random() < DUPLICATE_RATE:
            self.duplicates += 1
            due = time.monotonic() + self._rng.uniform(0.0, 1.5)
            heapq.heappush(self._later, (due, self.duplicates, event))

    def flush(self, everything: bool = False) -> None:
        while self._later and (everything or self._later[0][0] <= time.monotonic()):
            self._now.append(heapq.heappop(self._later)[2])
        if self._now:
            self._publish(self._now)
            self._now = []


@dataclass
class _Progress:
    launched: int = 0
    done: int = 0
    kills: int = 0
    last_kill: float = 0.0
    kill_due: float | None = None
    timed_out: bool = False
    broker_kills: int = 0
    recoveries: list[float] = field(default_factory=list)  # broker back -> next flow done
    unrecovered: int = 0


def run_chaos(
    settings: Settings,
    out: Renderer,
    proposals: int = 2000,
    kills: int = 10,
    seed: int = 7,
    *,
    broker: str = "apache",
    instances: int = 1,
    time_limit_s: float | None = None,
    keep_state: bool = False,
    broker_kills: int = 0,
    broker_down_s: float = 5.0,
    cluster: int = 1,
) -> int:
    """Run the chaos scenario (module docstring); 0 when every check holds, else 1."""
    bad = min(proposals, instances, cluster) < 1 or min(kills, broker_kills, broker_down_s) < 0
    if bad:
        out.error(
            Code.USAGE,
            "--proposals, --instances and --cluster must be at least 1, --kills, "
            "--broker-kills and --broker-down at least 0",
        )
        return 2
    if cluster > 1 and settings.bootstrap_servers:
        out.error(Code.USAGE, "--cluster starts the run's own cluster: no --bootstrap-servers")
        return 2
    if broker_kills and settings.bootstrap_servers:
        out.error(Code.USAGE, "--broker-kills kills the run's own broker: no --bootstrap-servers")
        return 2
    limit = time_limit_s or max(180.0, 0.45 * proposals)  # 15 minutes for 2,000
    held = [f.down_s for f in CLUSTER_FAULTS] if cluster > 1 else [None]
    downs = [held[i % len(held)] or broker_down_s for i in range(broker_kills)]
    # On a cluster the flows go on through each outage, and its failover is one more wait.
    limit += sum(downs) + broker_kills * BROKER_RECOVERY_LIMIT_S * (2 if cluster > 1 else 1)
    started = time.monotonic()
    own: ApacheKafka | KafkaCluster | None = None
    if not settings.bootstrap_servers:
        try:
            own = KafkaCluster(cluster).start() if cluster > 1 else ApacheKafka().start()
        except KafkaUnavailable as exc:
            out.error(Code.BROKER_UNAVAILABLE, f"chaos: no {broker} broker: {exc}")
            return 1
    state = Path(tempfile.mkdtemp(prefix="callgate-chaos-"))
    ok = False
    try:
        run = settings.model_copy(
            update={
                "state_dir": state,
                "backend": "kafka",
                "bootstrap_servers": settings.bootstrap_servers or (own and own.bootstrap),
                "topic_prefix": f"chaos-{uuid.uuid4().hex[:8]}",
                "faults": {**FAULTS, "seed": seed},
                "profile": limited_profile(state, proposals),
                "dev": True,  # its sessions come from the development issuer
            }
        )
        outages = Outages(own, broker_kills, broker_down_s)
        report = _run(
            bootstrap(run), out, proposals, kills, seed, started, limit, broker, instances, outages
        )
        report["figures"]["brokers"] = cluster
        report["state_dir"] = str(state)
        ok = not report["violations"]
        _render(out, report, ok)
        return 0 if ok else 1
    finally:
        if own is not None:
            own.stop()
        if ok and not keep_state:
            shutil.rmtree(state, ignore_errors=True)
        elif not ok:
            out.err.print(f"[yellow]chaos: state and worker logs kept in {state}[/]")


def limited_profile(state: Path, proposals: int) -> Path:
    """The default profile with the run's limit on ticket creations (module docstring)."""
    source = default_profile_path()
    raw = yaml.safe_load(source.read_text())
    raw["limits"] = [
        {
            "name": LIMIT_NAME,
            "tools": ["tickets.create"],
            "max": limit_max(proposals),
            "window": "24h",
            "per": ["actor"],
        }
    ]
    target = state / "profile" / "profile.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(raw, sort_keys=False))
    shutil.copy(source.parent / raw["policy_file"], target.parent / raw["policy_file"])
    return target


def _run(
    app: App,
    out: Renderer,
    n: int,
    kills: int,
    seed: int,
    started: float,
    limit: float,
    broker: str,
    instances: int,
    outages: Outages,
) -> dict[str, Any]:
    rng = random.Random(seed)
    app.keys  # noqa: B018  (key material exists before the workers start, so all share it)
    create_topics(app)
    fleet = Fleet(app, instances)
    fleet.start()
    gate = Gateway(app, app.kafka_backend())
    outbox = _Outbox(gate.backend.publish, rng)
    work = Workload(app, rng, outbox.send)
    progress = _Progress()
    try:
        kill_rng = random.Random(f"{seed}:kills")  # where and when, independent of the flows
        outages.plan(random.Random(f"{seed}:broker"), n)
        _drive(
            gate, fleet, work, outbox, progress, n, kills, kill_rng, out, started + limit, outages
        )
        settled = _settle(gate, work, fleet, out, started + limit)
        verified, replayed = _consistent(gate, fleet, started + limit)
        effects = gate.effects()
        evidence = Evidence(
            calls=work.calls,
            statuses=settled,
            effects=effects,
            audit=gate.audit(
                session=gate.app.session_issuer.issue(
                    "chaos-operator", "chaos", [OPERATOR_ROLE], gate.app.clock()
                )
            ),
            events=list(gate.backend.read_events()),
            flow_failures=work.failures,
        )
    finally:
        gate.close()
        fleet.stop()
    verdict = final_verdict(evidence, app, verified, replayed)
    elapsed = time.monotonic() - started
    if progress.kills < kills:
        verdict.violations.append(f"only {progress.kills} of {kills} kills happened")
    if progress.broker_kills < outages.kills:
        verdict.violations.append(f"only {progress.broker_kills} of {outages.kills} broker kills")
    if progress.unrecovered:
        verdict.violations.append(
            f"{progress.unrecovered} broker restarts not followed by a flow done within "
            f"{BROKER_RECOVERY_LIMIT_S:.0f}s"
        )
    if len(fleet.takeovers) < fleet.instance_kills:
        missed = fleet.instance_kills - len(fleet.takeovers)
        verdict.violations.append(f"{missed} takeovers not done within {TAKEOVER_LIMIT_S:.0f}s")
    if progress.timed_out or elapsed > limit:
        verdict.violations.append(f"time limit exceeded: {elapsed:.0f}s > {limit:.0f}s")
    figures: dict[str, Any] = {
        "proposals": n,
        "proposal events": work.counts.proposals,
        "approval decisions": work.counts.decisions,
        "broker": broker,
        "instances": instances,
        "decisions resubmitted (not_pending)": work.counts.decisions_resubmitted,
        "kills": progress.kills,
        "killed": dict(sorted(fleet.killed.items())),
        "restarts": fleet.restarts,
        "duplicates injected": outbox.duplicates,
        "events seen twice, by type": _seen_twice(evidence.events),
        "resubmissions after uncertain": work.counts.retries,
        "instance kills": fleet.instance_kills,
        "takeover s (max)": round(max(fleet.takeovers, default=0.0), 1),
        "takeover s (each)": ", ".join(f"{t:.1f}" for t in fleet.takeovers),
        "broker kills": progress.broker_kills,
        "broker down s (each)": outages.down_s,
        "broker kills took": "; ".join(outages.what),
        "cluster: kill to next flow done s (each)": ", ".join(f"{t:.1f}" for t in outages.costs),
        "broker recovery s (max)": round(max(progress.recoveries, default=0.0), 1),
        "broker recovery s (each)": ", ".join(f"{t:.1f}" for t in progress.recoveries),
        "worker stalls": sum(sum(s.stalls.values()) for s in fleet.sups),
        **verdict.figures,
        "audit chain ok": verified.ok,
        "audit records": verified.records,
        "replay equal": bool(replayed["equal"]),
        "replayed events": replayed["events"],
        "elapsed s": round(elapsed, 1),
        "time limit s": round(limit),
    }
    return {"figures": figures, "violations": verdict.violations, "seed": seed}


def final_verdict(
    evidence: Evidence, app: App, verified: VerifyResult, replayed: Mapping[str, Any]
) -> Verdict:
    """The checks every form of the chaos run ends with: the evidence verified (kept in
    the state directory when it fails), the audit chain, and replay equal to the live
    views."""
    verdict = verify(evidence, app.profile)
    if verdict.violations:
        _keep_evidence(app.settings.state_dir / "evidence.jsonl", evidence)
    if not verified.ok:
        verdict.violations.append(f"audit chain: {verified.first_bad}: {verified.reason}")
    if not replayed["equal"]:
        differing = {k: v["differing"] for k, v in replayed["views"].items() if not v["equal"]}
        verdict.violations.append(f"replay differs from the live views: {differing}")
    return verdict


def _keep_evidence(path: Path, evidence: Evidence) -> None:
    """On a failed run, keep the log and the statuses for diagnosis (the broker is gone)."""
    with path.open("w") as f:
        for event in evidence.events:
            row = {"type": type(event).__name__, **dataclasses.asdict(event)}
            f.write(json.dumps(row, default=str) + "\n")
        for inv, status in evidence.statuses.items():
            f.write(json.dumps({"type": "status", "invocation_id": inv, **status}) + "\n")
        for effect in evidence.effects:
            f.write(json.dumps({"type": "effect", **effect}, default=str) + "\n")


def _drive(
    gate: Gateway,
    fleet: Fleet,
    work: Workload,
    outbox: _Outbox,
    p: _Progress,
    n: int,
    kills: int,
    rng: random.Random,
    out: Renderer,
    deadline: float,
    outages: Outages,
) -> None:
    """Launch flows (at most ``WINDOW`` in flight), advance each when its wait is answered,
    and SIGKILL a worker (or an instance) whenever completed flows pass one of the random
    kill points. The flows go on while an instance kill waits for the takeover. At a broker
    kill point the broker is SIGKILLed; the flows pause while it is down (a client meets
    ``broker_unavailable`` then), and go on once it is back."""
    kill_at = sorted(rng.uniform(0.02, 0.85) * n for _ in range(kills))
    active: dict[int, tuple[Script, Wait]] = {}
    report = [time.monotonic() + 5]

    def step() -> None:
        now = time.monotonic()
        if now > deadline:
            p.timed_out = True
            return
        fleet.check()
        while len(active) < WINDOW and p.launched < n:
            i = p.launched
            script = work.script(i, pick_kind(work.rng, i, n))
            active[i] = (script, next(script))
            p.launched += 1
        outbox.flush()
        gate.backend.wait(lambda: False, 0.03)  # take in what the views have produced
        for i, (script, wait) in list(active.items()):
            value = gate.backend.view(wait.view, wait.key)
            if value is not None and wait.ready(value):
                try:
                    active[i] = (script, script.send(value))
                except StopIteration:
                    del active[i]
                    p.done += 1
            elif now - wait.since > STEP_TIMEOUT_S:
                work.failures.append(f"flow {i}: no answer for {wait.view} {wait.key}")
                script.close()
                del active[i]
                p.done += 1
        if now > report[0]:
            report[0] = now + 5
            if not out.json_mode:
                out.err.print(
                    f"[dim]chaos: {p.done}/{n} flows done, {len(active)} in flight, "
                    f"{p.kills} kills, {work.counts.retries} resubmissions[/]"
                )

    while p.launched < n or active:
        step()
        if p.timed_out:
            work.failures += [f"flow {i}: still waiting at the time limit" for i in active]
            return
        now = time.monotonic()
        if kill_at and p.done >= kill_at[0] and now - p.last_kill > MIN_KILL_GAP_S:
            kill_at.pop(0)
            p.kill_due = now + rng.uniform(0.0, 0.5)  # a random moment, the flows go on
        if p.kill_due is not None and now >= p.kill_due and fleet.can_kill():
            p.kill_due = None
            _kill(fleet, p, rng, out, step)
        if outages.due(p.done):
            outages.kill_and_restart(fleet, p, out, step, lambda: bool(active))
    outbox.flush(everything=True)
    while p.kills < kills and time.monotonic() < deadline:  # kill points not reached
        time.sleep(max(0.0, p.last_kill + MIN_KILL_GAP_S - time.monotonic()))
        time.sleep(rng.uniform(0.0, 0.5))
        while not fleet.can_kill() and time.monotonic() < deadline:
            fleet.check()
            time.sleep(0.2)
        _kill(fleet, p, rng, out, fleet.check)


@dataclasses.dataclass(frozen=True)
class ClusterFault:
    """One broker kill of a cluster run: the node it takes (the one leading the most
    partitions, or the active controller) and how long it stays down (None:
    ``--broker-down``)."""

    label: str
    node: Literal["busiest", "controller"]
    down_s: float | None = None


# The faults of a cluster run, in turn.
CLUSTER_FAULTS = (
    ClusterFault("the busiest leader", "busiest"),
    ClusterFault("the active controller", "controller"),
    ClusterFault("the busiest leader, for a minute", "busiest", 60.0),
)


class Outages:
    """The broker kills of a run: SIGKILL the run's own broker at random points of the
    flows, keep it down, start it again on its data, and time the recovery. On a cluster
    the kills take its nodes in the turn of ``CLUSTER_FAULTS`` while the flows go on."""

    def __init__(
        self, broker: ApacheKafka | KafkaCluster | None, kills: int, down_s: float
    ) -> None:
        self.broker = broker
        self.kills = kills if broker is not None else 0
        self.down_s = down_s
        self.what: list[str] = []  # each kill: what it took
        self.costs: list[float] = []  # cluster: each kill to the next flow done
        self._at: list[float] = []

    def plan(self, rng: random.Random, flows: int) -> None:
        self._at = sorted(rng.uniform(0.1, 0.8) * flows for _ in range(self.kills))

    def due(self, done: int) -> bool:
        return bool(self._at) and done >= self._at[0]

    def kill_and_restart(
        self,
        fleet: Fleet,
        p: _Progress,
        out: Renderer,
        step: Callable[[], None],
        busy: Callable[[], bool],
    ) -> None:
        """One outage; ``busy()``: flows are in flight, so the fault's cost and the
        recovery are timed by the next one done (none in flight: nothing to time; on a
        cluster the flows go on during the outage and may all be done by its end)."""
        assert self.broker is not None
        self._at.pop(0)
        down_s, killed = self.down_s, time.monotonic()
        if isinstance(self.broker, KafkaCluster):
            fault = CLUSTER_FAULTS[p.broker_kills % len(CLUSTER_FAULTS)]
            down_s = fault.down_s or down_s
            target = self.broker.controller() if fault.node == "controller" else None
            which = f"node {self.broker.kill(target)} ({fault.label})"
        else:
            self.broker.kill()
            which = "the broker"
        self.what.append(which)
        p.broker_kills += 1
        if not out.json_mode:
            out.err.print(f"[dim]chaos: {which} SIGKILLed, down for {down_s:g}s[/]")
        done, cost = p.done, None
        down_until = killed + down_s
        cluster = isinstance(self.broker, KafkaCluster)
        while time.monotonic() < down_until:
            if cluster and not p.timed_out:
                step()  # the cluster serves on without the node
                if cost is None and p.done > done:
                    cost = time.monotonic() - killed
                    self.costs.append(cost)
            else:
                fleet.check()  # workers that end themselves meanwhile are restarted
                time.sleep(0.2)
        self.broker.start()
        back, done = time.monotonic(), p.done
        while busy() and p.done == done and not p.timed_out:
            if time.monotonic() - back > BROKER_RECOVERY_LIMIT_S:
                p.unrecovered += 1
                return
            step()
        if busy() or p.done > done:
            p.recoveries.append(time.monotonic() - back)
        if cluster and cost is None and p.done > done:
            self.costs.append(time.monotonic() - killed)


def _seen_twice(events: Sequence[ev.Event]) -> dict[str, int]:
    """Events on the log twice (a guard: ``read_committed`` hides a killed writer's
    uncommitted records, so none are expected), by type: where the kills landed."""
    ids = Counter(e.event_id for e in events)
    twice = {e.event_id: e.event_type for e in events if ids[e.event_id] > 1}
    return dict(sorted(Counter(twice.values()).items()))


def _kill(
    fleet: Fleet, p: _Progress, rng: random.Random, out: Renderer, keep_going: Callable[[], None]
) -> None:
    name = fleet.kill_one(rng, keep_going)
    p.kills += 1
    p.last_kill = time.monotonic()
    if not out.json_mode:
        out.err.print(f"[magenta]chaos: SIGKILL {name} (kill {p.kills})[/]")


def _settle(
    gate: Gateway, work: Workload, fleet: Fleet, out: Renderer, deadline: float
) -> dict[str, dict[str, Any]]:
    """Wait (restarting dead workers) until every published proposal has a settled status;
    returns the statuses (missing ones are lost)."""
    ids = sorted(work.calls)
    statuses: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        fleet.check()
        gate.backend.wait(lambda: False, 0.2)
        for inv in ids:
            if inv not in statuses or not statuses[inv].get("settled"):
                value = gate.backend.view("status", inv)
                if value is not None:
                    statuses[inv] = value
        if all(statuses.get(i, {}).get("settled") for i in ids):
            break
    gate.backend.wait(lambda: False, 2.0)  # late changes, e.g. a reconciled original
    return {i: gate.backend.view("status", i) or statuses.get(i, {}) for i in ids}


def _consistent(
    gate: Gateway, fleet: Fleet, deadline: float
) -> tuple[VerifyResult, dict[str, Any]]:
    """Audit verification and replay, retried while the projections may still be catching
    up (a lagging view converges; a wrong one stays wrong until the deadline). Dead
    workers are started again meanwhile, as ``serve`` would: a projection that died after
    its last input still has a timer's late event to fold (an approval's expiry)."""
    give_up = min(deadline, time.monotonic() + 90)
    while True:
        fleet.check()
        gate.backend.wait(lambda: False, 1.0)
        verified = gate.verify_audit()
        replayed = replay(gate)
        if (verified.ok and replayed["equal"]) or time.monotonic() > give_up:
            return verified, replayed
        time.sleep(2.0)


def _render(
    out: Renderer,
    report: dict[str, Any],
    ok: bool,
    name: str = "chaos",
    zero: Iterable[str] = (),
    true: Iterable[str] = (),
) -> None:
    """The figures as a table with a check per figure (``zero``, ``true``: more that must
    be 0 or true), then the violations; with ``--json`` the report as one value."""
    figures: dict[str, Any] = report["figures"]
    must_be_true = {"audit chain ok", "replay equal", *true}
    must_be_zero = {
        *zero,
        "lost",
        "conflicting outcomes",
        "unexpected outcomes",
        "double effects",
        "effects of unknown calls",
        "unapproved high-impact effects",
        "effects not reported executed",
        "uncertain outcomes not reconciled",
    }

    def human(c: Any) -> None:
        t = Table(title=f"callgate {name} (seed {report['seed']})")
        t.add_column("figure")
        t.add_column("value", justify="right")
        t.add_column("check")
        for figure, value in figures.items():
            check = ""
            if figure in must_be_zero:
                check = "[green]ok[/]" if value == 0 else "[red]FAIL[/]"
            elif figure in must_be_true:
                check = "[green]ok[/]" if value else "[red]FAIL[/]"
            shown = (
                ", ".join(f"{k} {v}" for k, v in value.items())
                if isinstance(value, dict)
                else value
            )
            t.add_row(figure, str(shown), check)
        c.print(t)
        for line in report["violations"][:30]:
            c.print(f"[red]violation:[/] {line}")
        more = len(report["violations"]) - 30
        if more > 0:
            c.print(f"[red]… and {more} more[/]")
        c.print(f"[green]{name}: all checks hold[/]" if ok else f"[red]{name}: checks FAILED[/]")

    out.value({**report, "ok": ok}, human)
