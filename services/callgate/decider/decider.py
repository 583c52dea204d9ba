"""The invocation decider: every rule of the contract, as one pure process (C1-C12).

``handle(state, event, now_ms) -> (state, events)`` is decide then evolve (ADR 0092): the
rules read the partition key's state and emit the follow-on events, and the new state is
the fold of ``evolve`` over the input and those events, in that order. No I/O, no clock
(``now_ms`` is passed in), no random ids (event ids derive from the causing event;
Ed25519 signatures are deterministic). States are immutable: ``handle`` returns a new one
and never changes the one it was given, so a runner whose transaction aborts keeps it.

This module holds the Process protocol, what the decider reacts to, the dispatch to
the modules that hold the rules (see the package docstring), and the expiry timers
of pending approvals and unused artifacts (C11).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from callgate.decider import limits as usage
from callgate.decider.approvals import on_approval_decision
from callgate.decider.authorization import continue_approved, reject_late
from callgate.decider.deps import DeciderDeps
from callgate.decider.emitter import Emitter, tick_event
from callgate.decider.outcomes import (
    on_dry_run,
    on_dry_run_failed,
    on_reconciled,
    on_uncertain,
    settle_execution,
)
from callgate.decider.proposals import on_described, on_proposed, on_usage
from callgate.decider.state import (
    ApprovalStatus,
    DeciderState,
    Invocation,
    Phase,
    dump_state,
    load_state,
)
from callgate.domain import events as ev
from callgate.domain.catalog import ProfileError
from callgate.domain.codes import Rejection
from callgate.domain.freeze import FREEZE_EVENTS, FREEZE_KEY
from callgate.domain.freeze import evolve as evolve_freezes
from callgate.domain.pins import PIN_EVENTS, PINS_KEY
from callgate.domain.pins import evolve as evolve_pins
from callgate.domain.policy import PolicyEngine
from callgate.domain.policy_versions import POLICY_EVENTS, PolicyVersions, profile_of
from callgate.domain.policy_versions import evolve as evolve_versions
from callgate.domain.process_port import Output
from callgate.domain.simulation import Simulator, recorded_gate

# The control events: process-wide, not a key's state. Each kind shares one partition key,
# so one partition holds it in order; on Kafka every decider worker reads those partitions
# whole (ADR 0064), not only the worker that owns them.
CONTROL_EVENTS: tuple[type[ev.Event], ...] = (*POLICY_EVENTS, *FREEZE_EVENTS, *PIN_EVENTS)
CONTROL_KEYS: tuple[str, ...] = (ev.POLICY_KEY, FREEZE_KEY, PINS_KEY)


class Decider:
    """The invocation decider process (C1-C12)."""

    name = "decider"
    inputs = frozenset({"requests", "events"})
    recovers = False
    # What ``handle`` dispatches on; every other event is the decider's own output or none
    # of its concern (``process.reacts_to``).
    reacts_to: frozenset[type[ev.Event]] = frozenset(
        {
            ev.ToolCallProposed,
            ev.ResourceDescribed,
            ev.ApprovalDecisionSubmitted,
            ev.DryRunRecorded,
            ev.DryRunFailed,
            ev.ExecutionSucceeded,
            ev.ExecutionFailed,
            ev.ExecutionUncertain,
            ev.ExecutionReconciled,
            ev.ExecutionStarted,
            ev.UsageReserved,
            ev.UsageRefused,
            *CONTROL_EVENTS,
        }
    )

    control_events = CONTROL_EVENTS
    control_keys = CONTROL_KEYS

    def __init__(self, deps: DeciderDeps) -> None:
        self.deps = deps
        # The policy versions folded from the log in order (ADR 0050): process-wide, not a
        # key's state, so every key decides with the version active at its input's position.
        # Control state is immutable: each control event replaces these references.
        self.versions = PolicyVersions()
        self._shadow: Simulator | None = None
        # Control events folded, by id: one may arrive twice (at start and again from the
        # log; on Kafka from the global input and from the partition this worker owns),
        # and folding an older one again would undo a later one. Delivery bookkeeping, not
        # state: a set, so seeding many control events stays linear.
        self._folded: set[str] = set()

    def seed(self, events: Sequence[ev.Event]) -> None:
        """Fold control events read beside the log (at start: those before this process's
        position; on Kafka: the global input's, ADR 0064)."""
        for event in events:
            self._on_control(event)

    def _on_control(self, event: ev.Event) -> None:
        if event.event_id in self._folded:
            return
        self._folded.add(event.event_id)
        if isinstance(event, FREEZE_EVENTS):
            self.deps = replace(self.deps, freezes=evolve_freezes(self.deps.freezes, event))
        elif isinstance(event, PIN_EVENTS):
            self.deps = replace(self.deps, pins=evolve_pins(self.deps.pins, event))
        else:
            self._on_policy(event)

    def _on_policy(self, event: ev.Event) -> None:
        before, self.versions = self.versions, evolve_versions(self.versions, event)
        if (before.active, before.shadow) == (self.versions.active, self.versions.shadow):
            return
        # Content whose digest is not its version (only a forged event: the gateway checks)
        # is not decided with: the version before it stays (``profile_of`` refuses it).
        active = self.versions.active
        if active and active != self.deps.profile.digest:
            try:
                profile = profile_of(self.versions.published[active])
                self.deps = replace(self.deps, profile=profile, policy=PolicyEngine(profile))
            except (Rejection, ProfileError):
                self.versions = replace(self.versions, active=self.deps.profile.digest)
        shadow = self.versions.shadow
        try:
            if not shadow:
                self._shadow = None
            elif self._shadow is None or self._shadow.profile.digest != shadow:
                self._shadow = Simulator(profile_of(self.versions.published[shadow]))
        except (Rejection, ProfileError):
            self.versions, self._shadow = replace(self.versions, shadow=""), None

    def _shadow_decisions(self, out: Emitter) -> None:
        """Decide each ``PolicyDecided`` just emitted again under the shadow version, with
        the simulation's steps; a different gate is a ``ShadowDecisionDiffered`` (the call
        goes on as the active version decided)."""
        shadow = self._shadow
        if shadow is None:
            return
        for decided in list(out.out):
            if not isinstance(decided, ev.PolicyDecided):
                continue
            candidate, why = shadow.gate(decided)
            active = recorded_gate(decided)
            if candidate == active:
                continue
            out.out.append(
                ev.ShadowDecisionDiffered(
                    event_id=f"{decided.event_id}:shadow",
                    invocation_id=decided.invocation_id,
                    partition_key=decided.partition_key,
                    causation_id=decided.event_id,
                    correlation_id=decided.correlation_id,
                    occurred_at=decided.occurred_at,
                    producer=decided.producer,
                    tool=decided.tool,
                    actor=decided.actor,
                    call_tenant=decided.tenant,
                    agent=decided.agent,
                    delegation=decided.delegation,
                    active_version=decided.policy_version,
                    active_outcome=active,
                    candidate_version=shadow.profile.digest,
                    candidate_outcome=candidate,
                    reason=why,
                )
            )

    # -- Process protocol ----------------------------------------------------------

    def initial_state(self) -> DeciderState:
        return DeciderState()

    def dump_state(self, state: DeciderState) -> bytes:
        return dump_state(state)

    def load_state(self, data: bytes) -> DeciderState:
        return load_state(data)

    def next_due(self, state: DeciderState) -> int | None:
        return state.next_due()

    def follow_up(
        self, state: DeciderState, committed: Sequence[ev.Event], now_ms: int
    ) -> tuple[DeciderState, Sequence[Output]]:
        return state, ()

    def recover(self, state: DeciderState, now_ms: int) -> tuple[DeciderState, Sequence[Output]]:
        return state, ()

    def handle(
        self, state: DeciderState, event: ev.Event, now_ms: int
    ) -> tuple[DeciderState, Sequence[Output]]:
        """Decide, then evolve: ``out.state`` starts as ``state`` with ``event`` folded and
        folds each follow-on event as it is emitted (``Emitter``)."""
        if type(event) not in self.reacts_to:
            # Its own output read back (folded when emitted), or none of its concern.
            return state, ()
        out = Emitter(event, now_ms, state)
        if isinstance(event, CONTROL_EVENTS):
            self._on_control(event)
        elif isinstance(event, ev.ToolCallProposed):
            on_proposed(self.deps, event, out)
            self._shadow_decisions(out)
        elif isinstance(event, ev.ResourceDescribed):
            on_described(self.deps, event, out)
            self._shadow_decisions(out)
        elif isinstance(event, ev.ApprovalDecisionSubmitted):
            granted = on_approval_decision(self.deps, event, out)
            inv = out.state.invocations.get(event.invocation_id)
            # ADR 0029; a freeze stops a continuation too (ADR 0054)
            if granted is not None and inv is not None and not self._stopped(inv, out):
                continue_approved(inv, granted, out)
        elif isinstance(event, ev.DryRunRecorded):
            inv = out.state.invocations.get(event.invocation_id)
            if inv is None or inv.phase not in _BEFORE_EXECUTION or not self._stopped(inv, out):
                on_dry_run(event, out)
        elif isinstance(event, ev.DryRunFailed):
            on_dry_run_failed(event, out)
        elif isinstance(event, ev.ExecutionSucceeded | ev.ExecutionFailed):
            settle_execution(event.invocation_id, out)
        elif isinstance(event, ev.ExecutionUncertain):
            on_uncertain(event, out)
        elif isinstance(event, ev.ExecutionReconciled):
            on_reconciled(event, out)
        elif isinstance(event, ev.UsageReserved | ev.UsageRefused):
            on_usage(self.deps, event, out)
            self._shadow_decisions(out)
        # ExecutionStarted changes the state alone (``evolve``).
        usage.settle(usage.touched(event, out.out), out)  # ADR 0079
        return out.state, out.out

    def _stopped(self, inv: Invocation, out: Emitter) -> bool:
        """Refuse ``inv`` with ``frozen`` when a freeze now stops it (ADR 0054), or with
        ``tool_definition_changed`` when its upstream tool no longer matches its pin (ADR
        0066): an approved call that would go on to run is checked again at that step."""
        try:
            self.deps.freezes.check(inv.tool, inv.tenant, inv.actor)
            spec = self.deps.profile.tool(inv.tool)
            self.deps.pins.check(inv.tool, spec.pin if spec is not None else None)
        except Rejection as r:
            reject_late(inv, r, out)
            return True
        return False

    def due(self, state: DeciderState, now_ms: int) -> tuple[DeciderState, Sequence[Output]]:
        """Expire pending approvals and unused artifacts on schedule (C11), as events
        (folded by ``evolve`` like any)."""
        outputs: list[Output] = []
        for inv in sorted(state.invocations.values(), key=lambda i: i.invocation_id):
            if inv.approval_status == ApprovalStatus.PENDING and inv.approval_expires_at <= now_ms:
                tick = tick_event(inv.invocation_id, "pending", now_ms)
                out = Emitter(replace(tick, partition_key=inv.partition_key), now_ms, state)
                out.emit(ev.ApprovalExpired, stage="pending")
                state = out.state
                outputs += out.out
        for jti, use in sorted(state.approvals.items()):
            if (
                use.status == ApprovalStatus.GRANTED
                and not use.consumed_by
                and use.expires_at <= now_ms
            ):
                owner = state.invocations.get(use.invocation_id)
                tick = tick_event(use.invocation_id, jti, now_ms)
                out = Emitter(replace(tick, partition_key=_pk_of(owner)), now_ms, state)
                out.emit(ev.ApprovalExpired, stage="granted", approval_jti=jti)
                state = out.state
                outputs += out.out
        for expired in [o for o in outputs if isinstance(o, ev.ApprovalExpired)]:
            # ADR 0079: what the expired call held goes back (``expired`` is folded already)
            out = Emitter(expired, now_ms, state, state)
            usage.settle([expired.invocation_id], out)
            state = out.state
            outputs += out.out
        return state, outputs


# Where a recorded dry-run is the last step before the execution is requested.
_BEFORE_EXECUTION = frozenset({Phase.CONFIRMING, Phase.DRY_RUN_THEN_EXECUTE})


def _pk_of(inv: Invocation | None) -> str:
    return inv.partition_key if inv is not None else ""


__all__ = ["CONTROL_EVENTS", "CONTROL_KEYS", "Decider"]
