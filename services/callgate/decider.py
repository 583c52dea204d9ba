"""The invocation decider: every rule of the contract, as one pure process.

``handle(state, event, now_ms) -> (state, events)`` folds the partition key's state
and returns the follow-on events. No I/O, no clock (``now_ms`` is passed in), no
random ids (event ids derive from the causing event; Ed25519 signatures are
deterministic). ``handle`` takes ownership of ``state`` and may update it in place;
runners discard it if their transaction aborts.

The order of checks for a proposal is DESIGN's, and the first failure is the outcome:
malformed_event → unauthenticated → unknown_tool → invalid_arguments →
identity_spoof → tool_forbidden → approval checks → idempotency → dry-run /
approval_required → execution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from callgate import events as ev
from callgate.approvals import (
    ApprovalBinding,
    ApprovalClaims,
    ApprovalSigner,
    ApprovalVerifier,
    approval_jti,
    check_approver,
    peek_claim,
    peek_partition_key,
    require_match,
)
from callgate.arguments import normalize_args, target_of
from callgate.canonical import (
    args_hash,
    canonical_json,
    derive_id,
    execution_token,
    partition_key,
    request_fingerprint,
)
from callgate.catalog import Confirmation, Profile, ToolSpec
from callgate.codes import Code, Rejection
from callgate.decider_state import (
    ApprovalStatus,
    ApprovalUse,
    DeciderState,
    Invocation,
    KeyRecord,
    KeyStatus,
    Phase,
    dump_state,
    load_state,
)
from callgate.identity import SessionVerifier, check_identity
from callgate.policy import PolicyEngine
from callgate.process import Output

PRODUCER = "decider"


@dataclass(frozen=True)
class DeciderDeps:
    """What the composition root hands the decider: catalog, policy and key material."""

    profile: Profile
    policy: PolicyEngine
    sessions: SessionVerifier
    approval_signer: ApprovalSigner
    approval_verifier: ApprovalVerifier


class _Emitter:
    """Builds follow-on events with envelopes derived from the causing event."""

    def __init__(self, cause: ev.Event, now_ms: int) -> None:
        self.cause = cause
        self.now_ms = now_ms
        self.out: list[Output] = []

    def emit(self, cls: type[ev.Event], invocation_id: str | None = None, **fields: Any) -> None:
        inv = invocation_id or self.cause.invocation_id
        self.out.append(
            cls(
                event_id=derive_id(self.cause.event_id, str(len(self.out)), cls.__name__),
                invocation_id=inv,
                partition_key=self.cause.partition_key,
                causation_id=self.cause.event_id,
                correlation_id=self.cause.correlation_id or self.cause.invocation_id,
                occurred_at=self.now_ms,
                producer=PRODUCER,
                **fields,
            )
        )


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
            ev.ApprovalDecisionSubmitted,
            ev.DryRunRecorded,
            ev.DryRunFailed,
            ev.ExecutionSucceeded,
            ev.ExecutionFailed,
            ev.ExecutionUncertain,
            ev.ExecutionReconciled,
            ev.ExecutionStarted,
        }
    )

    def __init__(self, deps: DeciderDeps) -> None:
        self.deps = deps

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
        out = _Emitter(event, now_ms)
        if isinstance(event, ev.ToolCallProposed):
            self._on_proposed(state, event, out)
        elif isinstance(event, ev.ApprovalDecisionSubmitted):
            self._on_approval_decision(state, event, out)
        elif isinstance(event, ev.DryRunRecorded):
            self._on_dry_run(state, event, out)
        elif isinstance(event, ev.DryRunFailed):
            self._on_dry_run_failed(state, event, out)
        elif isinstance(event, ev.ExecutionSucceeded):
            self._settle_execution(
                state, event.invocation_id, Code.EXECUTED, event.result_json, out
            )
        elif isinstance(event, ev.ExecutionFailed):
            self._settle_execution(
                state, event.invocation_id, Code.EXECUTION_FAILED, _message_json(event.message), out
            )
        elif isinstance(event, ev.ExecutionUncertain):
            self._on_uncertain(state, event, out)
        elif isinstance(event, ev.ExecutionReconciled):
            self._on_reconciled(state, event, out)
        elif isinstance(event, ev.ExecutionStarted):
            started = state.invocations.get(event.invocation_id)
            if started is not None:
                started.started_attempt = max(started.started_attempt, event.attempt)
        # Every other event on the log is the decider's own output or not its concern.
        return state, out.out

    def due(self, state: DeciderState, now_ms: int) -> tuple[DeciderState, Sequence[Output]]:
        """Expire pending approvals and unused artifacts on schedule (C11), as events."""
        outputs: list[Output] = []
        for inv in sorted(state.invocations.values(), key=lambda i: i.invocation_id):
            if inv.approval_status == ApprovalStatus.PENDING and inv.approval_expires_at <= now_ms:
                tick = _tick_event(inv.invocation_id, "pending", now_ms)
                out = _Emitter(replace(tick, partition_key=_pk_of(state, inv)), now_ms)
                out.emit(ev.ApprovalExpired, stage="pending")
                inv.approval_status = ApprovalStatus.EXPIRED
                rec = _key_record(state, inv)
                if rec is not None and rec.status == KeyStatus.PENDING_APPROVAL:
                    rec.status = KeyStatus.EXPIRED
                outputs += out.out
        for jti, use in sorted(state.approvals.items()):
            if (
                use.status == ApprovalStatus.GRANTED
                and not use.consumed_by
                and use.expires_at <= now_ms
            ):
                owner = state.invocations.get(use.invocation_id)
                tick = _tick_event(use.invocation_id, jti, now_ms)
                out = _Emitter(replace(tick, partition_key=_pk_of(state, owner)), now_ms)
                out.emit(ev.ApprovalExpired, stage="granted", approval_jti=jti)
                use.status = ApprovalStatus.EXPIRED
                if owner is not None:
                    owner.approval_status = ApprovalStatus.EXPIRED
                    rec = _key_record(state, owner)
                    if rec is not None and rec.status == KeyStatus.APPROVED:
                        rec.status = KeyStatus.EXPIRED
                outputs += out.out
        return state, outputs

    # -- proposals -------------------------------------------------------------------

    def _on_proposed(self, state: DeciderState, p: ev.ToolCallProposed, out: _Emitter) -> None:
        if p.invocation_id in state.invocations:
            return  # the same proposal delivered twice: already decided
        try:
            self._decide_proposal(state, p, out)
        except Rejection as r:
            out.emit(
                ev.ProposalRejected,
                code=r.code.value,
                message=r.message,
                tool=p.tool,
                actor=_actor_of(state, p),
                tenant=_tenant_of(state, p),
                details_json=canonical_json(r.details),
            )
            inv = state.invocations.setdefault(
                p.invocation_id,
                Invocation(p.invocation_id, Phase.SETTLED, r.code.value, tool=p.tool),
            )
            inv.phase, inv.outcome = Phase.SETTLED, r.code.value

    def _decide_proposal(self, state: DeciderState, p: ev.ToolCallProposed, out: _Emitter) -> None:
        deps, now = self.deps, out.now_ms
        try:
            principal = deps.sessions.verify(p.session_token, now)  # C6: identity from the session
        except Rejection:
            # malformed_event precedes unauthenticated (DESIGN order of checks). Routing by
            # key needs the tenant: take the token's unverified claim, for routing only.
            claimed = peek_claim(p.session_token, "tenant")
            if claimed is not None or p.idempotency_key is None:
                self._check_routing(p, claimed or "")
            raise
        # Record who is acting as early as we know it, so rejections are attributable (C9).
        state.invocations[p.invocation_id] = Invocation(
            p.invocation_id,
            Phase.SETTLED,
            "",
            partition_key=p.partition_key,
            tool=p.tool,
            actor=principal.user,
            tenant=principal.tenant,
        )
        self._check_routing(p, principal.tenant)
        spec = deps.profile.tool(p.tool)
        if spec is None:
            raise Rejection(Code.UNKNOWN_TOOL, f"no tool named {p.tool!r} in the catalog")
        args = normalize_args(spec, deps.profile.limits, p.args_json)  # C7: schema first
        args = check_identity(spec.identity_args, deps.profile.tenant_fields, args, principal)
        target = target_of(spec, args)
        decision = deps.policy.decide(principal, spec, target, args)  # C1, C2, C3, C7
        a_hash = args_hash(args)
        fingerprint = request_fingerprint(spec.name, target, args)
        high = spec.is_high_impact(args)
        confirmation = spec.confirmation_for(args)
        inv = Invocation(
            p.invocation_id,
            Phase.SETTLED,
            Code.ALLOWED.value if decision.allowed else Code.TOOL_FORBIDDEN.value,
            partition_key=p.partition_key,
            tool=spec.name,
            actor=principal.user,
            tenant=principal.tenant,
            target=target,
            args_json=canonical_json(args),
            args_hash=a_hash,
            fingerprint=fingerprint,
            policy_version=decision.policy_version,
            idempotency_key=p.idempotency_key,
            confirmation=confirmation.value,
            approver_roles=list(spec.approvers),
            allow_self_approval=spec.allow_self_approval,
            approval_ttl_ms=spec.approval_ttl_seconds * 1000,
        )
        state.invocations[p.invocation_id] = inv
        jti = _peek_jti(p.approval_id)
        out.emit(
            ev.PolicyDecided,
            actor=principal.user,
            tenant=principal.tenant,
            roles=principal.roles,
            tool=spec.name,
            target=target,
            args_json=inv.args_json,
            args_hash=a_hash,
            fingerprint=fingerprint,
            idempotency_key=p.idempotency_key,
            policy_version=decision.policy_version,
            decision="permit" if decision.allowed else "deny",
            determining_policies=decision.determining_policies,
            mutation=spec.mutation,
            high_impact=high,
            confirmation=confirmation.value,
            approval_jti=jti,
        )
        if not decision.allowed:
            return  # C12: tool_forbidden never reaches a provider
        claims = self._presented_approval(p, now)  # approval_missing / approval_expired
        if claims is not None and self._check_approval(state, inv, claims, p, out):
            return  # a replay of the very call the approval authorized
        rec = state.keys.get(p.idempotency_key) if p.idempotency_key is not None else None
        if rec is not None:
            self._on_known_key(state, inv, rec, claims, out)
            return
        self._authorize(state, inv, spec, claims, out)

    def _presented_approval(self, p: ev.ToolCallProposed, now: int) -> ApprovalClaims | None:
        if p.approval_id is None:
            return None
        return self.deps.approval_verifier.verify(p.approval_id, now)  # approval_missing/expired

    @staticmethod
    def _check_routing(p: ev.ToolCallProposed, tenant: str) -> None:
        """Partition-local checks need the right partition (DESIGN "Shape").

        With an approval but no key, the call belongs on the approved invocation's
        partition; the (unverified) claim only routes, the signature is checked later.
        """
        if p.idempotency_key is not None:
            expected = partition_key(tenant, p.idempotency_key, p.invocation_id)
        elif p.approval_id is not None:
            expected = peek_partition_key(p.approval_id) or ""
        else:
            expected = partition_key(tenant, None, p.invocation_id)
        if p.partition_key != expected:
            raise Rejection(
                Code.MALFORMED_EVENT,
                "misrouted: the partition key does not match the session tenant and "
                "idempotency key (or the approval's invocation)",
                {"expected": expected, "got": p.partition_key},
            )

    def _check_approval(
        self,
        state: DeciderState,
        inv: Invocation,
        claims: ApprovalClaims,
        p: ev.ToolCallProposed,
        out: _Emitter,
    ) -> bool:
        """C4, C11: the approval must be for this exact call, still usable, and unused.

        Returns True when the call was settled here (a replay of the call it authorized).
        """
        presented = claims.binding
        expected = _binding(inv, presented.dry_run_hash, p.partition_key, presented.invocation_id)
        require_match(expected, presented)  # approval_mismatch naming the bindings
        if presented.partition_key != p.partition_key:
            # Signed to another idempotency key's partition: only the invocation it was
            # granted for (resubmitted under that key) may use it, and single use is
            # tracked there. Anywhere else it is another invocation's approval.
            raise Rejection(
                Code.APPROVAL_CONSUMED,
                f"approval {claims.jti} belongs to invocation {presented.invocation_id} "
                "under another idempotency key; it cannot authorize this one",
                {"approved_invocation_id": presented.invocation_id},
            )
        use = state.approvals.get(claims.jti)
        if use is None:
            raise Rejection(Code.APPROVAL_MISSING, f"approval {claims.jti} is not known here")
        if use.status == ApprovalStatus.EXPIRED:
            raise Rejection(Code.APPROVAL_EXPIRED, f"approval {claims.jti} expired")
        if use.consumed_by:
            consumer = state.invocations.get(use.consumed_by)
            if (
                use.consumer_key is None
                and inv.idempotency_key is None
                and consumer is not None
                and consumer.phase == Phase.SETTLED
                and consumer.outcome in _REPLAYABLE
            ):
                # The very call it authorized, resubmitted: serve the stored result.
                inv.phase, inv.outcome = Phase.SETTLED, Code.REPLAYED.value
                out.emit(
                    ev.ReplayServed,
                    original_invocation_id=consumer.invocation_id,
                    original_outcome=consumer.outcome,
                    result_json=consumer.result_json,
                )
                return True
            if use.consumer_key is None or use.consumer_key != inv.idempotency_key:
                raise Rejection(
                    Code.APPROVAL_CONSUMED,
                    f"approval {claims.jti} was already used by invocation {use.consumed_by}",
                    {"used_by": use.consumed_by},
                )
        inv.approval_jti = claims.jti
        inv.approved_dry_run_hash = presented.dry_run_hash
        return False

    def _on_known_key(
        self,
        state: DeciderState,
        inv: Invocation,
        rec: KeyRecord,
        claims: ApprovalClaims | None,
        out: _Emitter,
    ) -> None:
        """C8: a key replays the original authorized call; it never authorizes by itself."""
        differing = [
            name
            for name, a, b in (
                ("actor", rec.actor, inv.actor),
                ("tool", rec.tool, inv.tool),
                ("target", rec.target, inv.target),
                ("fingerprint", rec.fingerprint, inv.fingerprint),
            )
            if a != b
        ]
        if differing:
            raise Rejection(
                Code.IDEMPOTENCY_CONFLICT,
                f"idempotency key reused with a different {', '.join(differing)}",
                {"differs": ",".join(differing), "original_invocation_id": rec.invocation_id},
            )
        if rec.status == KeyStatus.DONE:
            inv.phase, inv.outcome = Phase.SETTLED, Code.REPLAYED.value
            out.emit(
                ev.ReplayServed,
                original_invocation_id=rec.invocation_id,
                original_outcome=rec.outcome,
                result_json=rec.result_json,
            )
        elif rec.status == KeyStatus.DENIED:
            raise Rejection(
                Code.APPROVAL_DENIED,
                f"the approval for invocation {rec.invocation_id} was denied",
                {"original_invocation_id": rec.invocation_id},
            )
        elif rec.status in (KeyStatus.PENDING_APPROVAL, KeyStatus.APPROVED):
            if claims is None:
                raise Rejection(
                    Code.APPROVAL_REQUIRED,
                    f"awaiting approval of invocation {rec.invocation_id}; "
                    "resubmit with its approval_id",
                    {"pending_invocation_id": rec.invocation_id},
                )
            use = state.approvals[claims.jti]
            if use.consumed_by and use.consumed_by != inv.invocation_id:
                # C8: the same key and approval are being confirmed by another invocation
                # right now; wait for it and replay its outcome, never confirm twice.
                inv.phase, inv.outcome = Phase.WAITING, Code.ALLOWED.value
                rec.waiters.append(inv.invocation_id)
                return
            spec = self.deps.profile.tool(inv.tool)
            assert spec is not None  # checked before policy
            self._authorize(state, inv, spec, claims, out)
        elif rec.status == KeyStatus.EXPIRED:
            spec = self.deps.profile.tool(inv.tool)
            assert spec is not None
            del state.keys[inv.idempotency_key or ""]
            self._authorize(state, inv, spec, claims, out)
        elif rec.status == KeyStatus.UNCERTAIN:
            # C12: reconcile the original operation before anything else.
            inv.phase, inv.outcome = Phase.WAITING, Code.ALLOWED.value
            rec.status = KeyStatus.RECONCILING
            rec.waiters.append(inv.invocation_id)
            original = state.invocations.get(rec.invocation_id)
            out.emit(
                ev.ReconciliationRequested,
                tenant=inv.tenant,
                tool=rec.tool,
                target=rec.target,
                args_json=original.args_json if original else inv.args_json,
                execution_token=rec.execution_token,
                original_invocation_id=rec.invocation_id,
            )
        else:  # executing or reconciling: wait for the original to settle, then replay it
            inv.phase, inv.outcome = Phase.WAITING, Code.ALLOWED.value
            rec.waiters.append(inv.invocation_id)

    def _authorize(
        self,
        state: DeciderState,
        inv: Invocation,
        spec: ToolSpec,
        claims: ApprovalClaims | None,
        out: _Emitter,
    ) -> None:
        """The call passed every check: dry-run, ask for approval, or execute (C2-C5)."""
        if inv.idempotency_key is not None and inv.idempotency_key not in state.keys:
            state.keys[inv.idempotency_key] = KeyRecord(
                actor=inv.actor,
                tool=inv.tool,
                target=inv.target,
                fingerprint=inv.fingerprint,
                invocation_id=inv.invocation_id,
                status=KeyStatus.EXECUTING,
            )
        if claims is not None:
            # C5/C11: confirm against what the human saw: re-run the dry-run and compare.
            out.emit(
                ev.ConfirmationAccepted,
                approval_jti=claims.jti,
                approved_invocation_id=claims.binding.invocation_id,
                approver=claims.approver,
            )
            use = state.approvals[claims.jti]
            use.consumed_by, use.consumer_key = inv.invocation_id, inv.idempotency_key
            if spec.require_dry_run:
                inv.phase = Phase.CONFIRMING
                self._request_dry_run(inv, out)
            elif claims.binding.dry_run_hash != _no_dry_run_hash(inv):
                self._reject_late(state, inv, _mismatch(["dry_run_hash"]), out)
            else:
                self._request_execution(state, inv, out)
            return
        if Confirmation(inv.confirmation) is not Confirmation.NONE:
            inv.phase = Phase.AWAITING_DRY_RUN
            _set_key_status(state, inv, KeyStatus.PENDING_APPROVAL)
            if spec.require_dry_run:
                self._request_dry_run(inv, out)
            else:
                self._request_approval(state, inv, "{}", _no_dry_run_hash(inv), out)
            return
        if spec.require_dry_run:
            inv.phase = Phase.DRY_RUN_THEN_EXECUTE
            self._request_dry_run(inv, out)
            return
        self._request_execution(state, inv, out)

    @staticmethod
    def _request_dry_run(inv: Invocation, out: _Emitter) -> None:
        out.emit(
            ev.DryRunRequested,
            invocation_id=inv.invocation_id,
            tenant=inv.tenant,
            tool=inv.tool,
            target=inv.target,
            args_json=inv.args_json,
        )

    @staticmethod
    def _request_approval(
        state: DeciderState, inv: Invocation, snapshot_json: str, snapshot_hash: str, out: _Emitter
    ) -> None:
        inv.phase, inv.outcome = Phase.PENDING_APPROVAL, Code.APPROVAL_REQUIRED.value
        inv.dry_run_json, inv.dry_run_hash = snapshot_json, snapshot_hash
        inv.approval_status = ApprovalStatus.PENDING
        inv.approval_expires_at = out.now_ms + inv.approval_ttl_ms
        _set_key_status(state, inv, KeyStatus.PENDING_APPROVAL)
        out.emit(
            ev.ApprovalRequested,
            invocation_id=inv.invocation_id,
            tenant=inv.tenant,
            actor=inv.actor,
            tool=inv.tool,
            target=inv.target,
            args_json=inv.args_json,
            args_hash=inv.args_hash,
            dry_run_json=snapshot_json,
            dry_run_hash=snapshot_hash,
            policy_version=inv.policy_version,
            confirmation=inv.confirmation,
            approver_roles=tuple(inv.approver_roles),
            expires_at=inv.approval_expires_at,
        )

    @staticmethod
    def _request_execution(state: DeciderState, inv: Invocation, out: _Emitter) -> None:
        pk = out.cause.partition_key
        inv.phase, inv.outcome = Phase.EXECUTING, Code.ALLOWED.value
        inv.execution_token = execution_token(
            pk, inv.fingerprint, inv.invocation_id, inv.idempotency_key
        )
        inv.attempt += 1
        rec = _key_record(state, inv)
        if rec is not None:
            rec.status, rec.execution_token, rec.invocation_id = (
                KeyStatus.EXECUTING,
                inv.execution_token,
                inv.invocation_id,
            )
        out.emit(
            ev.ExecutionRequested,
            invocation_id=inv.invocation_id,
            tenant=inv.tenant,
            tool=inv.tool,
            target=inv.target,
            args_json=inv.args_json,
            execution_token=inv.execution_token,
            attempt=inv.attempt,
        )

    def _reject_late(
        self, state: DeciderState, inv: Invocation, r: Rejection, out: _Emitter
    ) -> None:
        """A rejection after authorization began: release what the invocation held."""
        inv.phase, inv.outcome = Phase.SETTLED, r.code.value
        if inv.approval_jti and inv.approval_jti in state.approvals:
            use = state.approvals[inv.approval_jti]
            if use.consumed_by == inv.invocation_id:
                use.consumed_by, use.consumer_key = "", None
        rec = _key_record(state, inv)
        waiters: list[str] = []
        if rec is not None and rec.invocation_id == inv.invocation_id:
            # Nothing was authorized under this key: free it so a corrected call can use it.
            waiters = rec.waiters
            del state.keys[inv.idempotency_key or ""]
        elif rec is not None and inv.approval_jti:
            # A confirmation failed: the same-key calls waiting on it fail with it.
            waiters, rec.waiters = rec.waiters, []
        for waiter in waiters:
            w = state.invocations.get(waiter)
            if w is not None:
                w.phase, w.outcome = Phase.SETTLED, r.code.value
            out.emit(
                ev.ProposalRejected,
                invocation_id=waiter,
                code=r.code.value,
                message=f"the original call {inv.invocation_id} failed: {r.message}",
                tool=inv.tool,
                actor=inv.actor,
                tenant=inv.tenant,
                details_json=canonical_json(
                    {**r.details, "original_invocation_id": inv.invocation_id}
                ),
            )
        out.emit(
            ev.ProposalRejected,
            invocation_id=inv.invocation_id,
            code=r.code.value,
            message=r.message,
            tool=inv.tool,
            actor=inv.actor,
            tenant=inv.tenant,
            details_json=canonical_json(r.details),
        )

    # -- approvals ---------------------------------------------------------------------

    def _on_approval_decision(
        self, state: DeciderState, d: ev.ApprovalDecisionSubmitted, out: _Emitter
    ) -> None:
        if d.event_id in state.decisions_seen:
            return  # the same decision delivered twice: already answered
        state.decisions_seen.append(d.event_id)
        try:
            approver = self.deps.sessions.verify(d.session_token, out.now_ms)
            inv = state.invocations.get(d.invocation_id)
            if inv is None or inv.approval_status != ApprovalStatus.PENDING:
                raise Rejection(
                    Code.NOT_PENDING, f"invocation {d.invocation_id} has no pending approval"
                )
            if inv.approval_expires_at <= out.now_ms:
                raise Rejection(Code.APPROVAL_EXPIRED, "the pending approval has expired")
            check_approver(
                inv.confirmation,
                approver,
                inv.actor,
                inv.tenant,
                tuple(inv.approver_roles),
                inv.allow_self_approval,
            )
            if d.decision not in ("grant", "deny"):
                raise Rejection(Code.MALFORMED_EVENT, f"unknown decision {d.decision!r}")
        except Rejection as r:
            out.emit(ev.ApprovalDecisionRejected, code=r.code.value, message=r.message)
            return
        if d.decision == "deny":
            inv.approval_status = ApprovalStatus.DENIED
            _set_key_status(state, inv, KeyStatus.DENIED)
            out.emit(ev.ApprovalDenied, approver=approver.user, reason=d.reason)
            return
        jti = approval_jti(inv.invocation_id, approver.user, d.event_id)
        expires_at = out.now_ms + inv.approval_ttl_ms
        claims = ApprovalClaims(
            jti=jti,
            binding=_binding(inv, inv.dry_run_hash, d.partition_key, inv.invocation_id),
            approver=approver.user,
            confirmation=inv.confirmation,
            issued_at=out.now_ms,
            expires_at=expires_at,
        )
        inv.approval_status = ApprovalStatus.GRANTED
        state.approvals[jti] = ApprovalUse(
            inv.invocation_id, ApprovalStatus.GRANTED, expires_at, approver=approver.user
        )
        _set_key_status(state, inv, KeyStatus.APPROVED)
        out.emit(
            ev.ApprovalGranted,
            approval_id=self.deps.approval_signer.sign(claims),
            approval_jti=jti,
            approver=approver.user,
            expires_at=expires_at,
        )

    # -- executor results ----------------------------------------------------------------

    def _on_dry_run(self, state: DeciderState, e: ev.DryRunRecorded, out: _Emitter) -> None:
        inv = state.invocations.get(e.invocation_id)
        if inv is None:
            return
        if inv.phase == Phase.AWAITING_DRY_RUN:
            self._request_approval(state, inv, e.snapshot_json, e.snapshot_hash, out)
        elif inv.phase == Phase.CONFIRMING:
            inv.dry_run_json, inv.dry_run_hash = e.snapshot_json, e.snapshot_hash
            if e.snapshot_hash != inv.approved_dry_run_hash:
                # The world changed since the human confirmed: that approval no longer covers it.
                self._reject_late(state, inv, _mismatch(["dry_run_hash"]), out)
            else:
                self._request_execution(state, inv, out)
        elif inv.phase == Phase.DRY_RUN_THEN_EXECUTE:
            inv.dry_run_json, inv.dry_run_hash = e.snapshot_json, e.snapshot_hash
            self._request_execution(state, inv, out)

    def _on_dry_run_failed(self, state: DeciderState, e: ev.DryRunFailed, out: _Emitter) -> None:
        inv = state.invocations.get(e.invocation_id)
        if inv is None or inv.phase not in (
            Phase.AWAITING_DRY_RUN,
            Phase.CONFIRMING,
            Phase.DRY_RUN_THEN_EXECUTE,
        ):
            return
        self._reject_late(
            state, inv, Rejection(Code.EXECUTION_FAILED, f"dry-run failed: {e.message}"), out
        )

    def _settle_execution(
        self,
        state: DeciderState,
        invocation_id: str,
        outcome: Code,
        result_json: str,
        out: _Emitter,
    ) -> None:
        inv = state.invocations.get(invocation_id)
        if inv is None or (inv.phase == Phase.SETTLED and inv.outcome != Code.OUTCOME_UNCERTAIN):
            return
        inv.phase, inv.outcome, inv.result_json = Phase.SETTLED, outcome.value, result_json
        rec = _key_record(state, inv)
        if rec is not None and rec.invocation_id == invocation_id:
            rec.status, rec.outcome, rec.result_json = KeyStatus.DONE, outcome.value, result_json
            self._serve_waiters(state, rec, out)

    def _serve_waiters(self, state: DeciderState, rec: KeyRecord, out: _Emitter) -> None:
        for waiter in rec.waiters:
            w = state.invocations.get(waiter)
            if w is not None:
                w.phase, w.outcome = Phase.SETTLED, Code.REPLAYED.value
            out.emit(
                ev.ReplayServed,
                invocation_id=waiter,
                original_invocation_id=rec.invocation_id,
                original_outcome=rec.outcome,
                result_json=rec.result_json,
            )
        rec.waiters = []

    def _on_uncertain(self, state: DeciderState, e: ev.ExecutionUncertain, out: _Emitter) -> None:
        inv = state.invocations.get(e.invocation_id)
        if inv is None or inv.phase != Phase.EXECUTING:
            return
        inv.phase, inv.outcome = Phase.SETTLED, Code.OUTCOME_UNCERTAIN.value
        # The executor reports an outcome only for a run it started, so the attempt in force
        # has started even if its ExecutionStarted was not seen: the two input topics are not
        # ordered with each other, and on tansu a re-decided proposal can arrive after the
        # ExecutionStarted of its aborted first decision. Without this the reconciliation
        # below would never retry (found by the chaos run: calls left waiting forever).
        inv.started_attempt = max(inv.started_attempt, inv.attempt)
        rec = _key_record(state, inv)
        if rec is None or rec.invocation_id != inv.invocation_id:
            return
        rec.status = KeyStatus.UNCERTAIN
        if rec.waiters:  # someone is already waiting: reconcile now (C12)
            rec.status = KeyStatus.RECONCILING
            out.emit(
                ev.ReconciliationRequested,
                tenant=inv.tenant,
                tool=inv.tool,
                target=inv.target,
                args_json=inv.args_json,
                execution_token=inv.execution_token,
                original_invocation_id=inv.invocation_id,
            )

    def _on_reconciled(self, state: DeciderState, e: ev.ExecutionReconciled, out: _Emitter) -> None:
        """C12: the provider said what happened; record it, then replay or execute once."""
        original_id = e.original_invocation_id or e.invocation_id
        original = state.invocations.get(original_id)
        if original is None or e.event_id in original.reconciliations:
            return  # unknown, or a duplicate delivery: one reconciliation, one retry at most
        original.reconciliations.append(e.event_id)
        rec = _key_record(state, original)
        if e.found:
            original.phase, original.outcome = Phase.SETTLED, Code.EXECUTED.value
            original.result_json = e.result_json
            if rec is not None and rec.invocation_id == original_id:
                rec.status, rec.outcome, rec.result_json = (
                    KeyStatus.DONE,
                    Code.EXECUTED.value,
                    e.result_json,
                )
                self._serve_waiters(state, rec, out)
            return
        # Not applied: execute exactly once more with the same token. Only for the attempt
        # in force: the executor's restart (recover) and a retry's ReconciliationRequested
        # can both look up one attempt; the later answer must not start a second retry
        # (found by the chaos run: a second effect, or a call left executing forever).
        moved_on = rec is not None and rec.invocation_id != original_id
        if moved_on or original.started_attempt != original.attempt:
            return
        target = original
        if rec is not None and rec.waiters and original.phase == Phase.SETTLED:
            target = state.invocations.get(rec.waiters.pop(0), original)
            target.execution_token = original.execution_token
            target.attempt = original.attempt
            rec.invocation_id = target.invocation_id
            use = state.approvals.get(original.approval_jti)
            if target is not original and use is not None:
                # C9: the retry completes the original's confirmed call; its audit record
                # names the approval that authorizes the effect (found by the chaos run).
                target.approval_jti = original.approval_jti
                out.emit(
                    ev.ConfirmationAccepted,
                    invocation_id=target.invocation_id,
                    approval_jti=original.approval_jti,
                    approved_invocation_id=use.invocation_id,
                    approver=use.approver,
                )
        self._request_execution(state, target, out)


def _binding(
    inv: Invocation, dry_run_hash: str, partition_key: str, invocation_id: str
) -> ApprovalBinding:
    """What an approval for ``inv`` binds (C4, C11): actor, tool, target, policy, arguments."""
    return ApprovalBinding(
        tenant=inv.tenant,
        actor=inv.actor,
        tool=inv.tool,
        target=inv.target,
        policy_version=inv.policy_version,
        args_hash=inv.args_hash,
        dry_run_hash=dry_run_hash,
        partition_key=partition_key,
        invocation_id=invocation_id,
    )


def _mismatch(bindings: list[str]) -> Rejection:
    return Rejection(
        Code.APPROVAL_MISMATCH,
        f"approval does not match: {', '.join(bindings)}",
        {"bindings": ",".join(bindings)},
    )


def _no_dry_run_hash(inv: Invocation) -> str:
    """Snapshot hash for tools without a dry-run: the human confirms the arguments."""
    return "args:" + inv.args_hash


def _message_json(message: str) -> str:
    return canonical_json({"error": message})


def _key_record(state: DeciderState, inv: Invocation) -> KeyRecord | None:
    return state.keys.get(inv.idempotency_key) if inv.idempotency_key is not None else None


def _set_key_status(state: DeciderState, inv: Invocation, status: str) -> None:
    rec = _key_record(state, inv)
    if rec is not None and rec.invocation_id == inv.invocation_id:
        rec.status = status


def _pk_of(state: DeciderState, inv: Invocation | None) -> str:
    return inv.partition_key if inv is not None else ""


def _peek_jti(approval_id: str | None) -> str | None:
    """The presented approval's id for the record; verification happens after policy."""
    return peek_claim(approval_id, "jti") if approval_id is not None else None


_REPLAYABLE = frozenset({Code.EXECUTED.value, Code.EXECUTION_FAILED.value})


def _tick_event(invocation_id: str, what: str, now_ms: int) -> ev.Event:
    """A synthetic cause for timer-fired events, so their ids stay deterministic."""
    return ev.Event(
        event_id=derive_id("timer", invocation_id, what),
        invocation_id=invocation_id,
        partition_key="",
        occurred_at=now_ms,
    )


def _actor_of(state: DeciderState, p: ev.ToolCallProposed) -> str:
    inv = state.invocations.get(p.invocation_id)
    return inv.actor if inv else ""


def _tenant_of(state: DeciderState, p: ev.ToolCallProposed) -> str:
    inv = state.invocations.get(p.invocation_id)
    return inv.tenant if inv else ""


__all__ = ["Decider", "DeciderDeps"]
