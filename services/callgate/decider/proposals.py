"""Deciding a proposal: the order of checks, up to the authorization (C1-C4, C6-C10, C12).

Proposal is not permission (C1): every call gets a policy decision on the session
identity (C6), after schema validation (C7), from the catalog (C10). The order of
checks is the contract's (docs/contract.md), and the first failure is the outcome: malformed_event →
unauthenticated → unknown_tool → invalid_arguments → identity_spoof (V1) →
tool_forbidden (C12: never reaches a provider) → approval checks (C4, C11) →
idempotency (C8) → dry-run / approval_required → execution.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from callgate.decider import limits as usage
from callgate.decider.approvals import check_approval, presented_approval
from callgate.decider.authorization import authorize, confirm_evaluation
from callgate.decider.deps import DeciderDeps
from callgate.decider.emitter import Emitter
from callgate.decider.idempotency import on_known_key
from callgate.decider.state import Invocation, Phase, parked_fields
from callgate.domain import events as ev
from callgate.domain.access_requests import TASK_PREFIX
from callgate.domain.approvals import peek_claim, peek_partition_key
from callgate.domain.arguments import normalize_args, target_of
from callgate.domain.canonical import args_hash, canonical_json, partition_key, request_fingerprint
from callgate.domain.catalog import Confirmation, ToolSpec
from callgate.domain.codes import Code, Rejection, Unanswerable
from callgate.domain.identity import token_digest
from callgate.domain.identity_args import check_identity
from callgate.domain.limits import MAX_RECORD_BYTES, parse_json
from callgate.domain.policy import NEW_RESOURCE, ResourceFacts
from callgate.domain.principal import Principal
from callgate.domain.scope import is_bound


def on_proposed(deps: DeciderDeps, p: ev.ToolCallProposed, out: Emitter) -> None:
    if not is_bound(p.invocation_id, p.session_token):
        # Before anything else: an id another session formed is never answered or decided
        # here (docs/contract.md, "Tenant scope of identifiers"); the runner dead-letters it.
        raise Unanswerable(
            Code.MALFORMED_EVENT,
            "the invocation id is not bound to the session token (domain/scope.py)",
        )
    if p.invocation_id in out.state.invocations:
        return  # the same proposal delivered twice: already decided
    who = _Who()
    _rejecting(p, out, who, lambda: _decide_proposal(deps, p, out, who))


@dataclass(slots=True)
class _Who:
    """The verified session of the proposal being decided, once known: a rejection names
    who asked (C9) before any record of the call exists."""

    principal: Principal | None = None


class UnreadableRecord(Rejection):
    """A record field two parsers could read differently: never decided, dead-lettered."""


def _strict_record(deps: DeciderDeps, p: ev.ToolCallProposed) -> None:
    """The record's JSON field through the one strict reader, before any decision: text
    that two parsers could read differently (duplicate keys, ``NaN``, a lone surrogate,
    not JSON) is never decided. Raised out of the decider, the ``Rejection`` makes the
    runner dead-letter the record with its reason and answer ``invalid_arguments``
    (``adapters/failures.py``), at the place of ``invalid_arguments`` in the order of
    checks. Limits of size, depth and numbers are decided as usual."""
    limits = deps.profile.entry_limits
    try:
        parse_json(p.args_json, max(limits.max_args_bytes, MAX_RECORD_BYTES), 1 << 16)
    except Rejection as r:
        if r.details.get("limit") in ("syntax", "unicode"):
            message = f"args_json: {r.message}"
            raise UnreadableRecord(Code.INVALID_ARGUMENTS, message, r.details) from None


def on_described(deps: DeciderDeps, e: ev.ResourceDescribed, out: Emitter) -> None:
    """The provider answered who owns the target: decide the proposal that waited (C7)."""
    inv = out.state.invocations.get(e.invocation_id)
    if inv is None or inv.phase != Phase.DESCRIBING:
        return  # a redelivered description: the proposal was decided on the first one
    facts = ResourceFacts(
        source=f"provider:{e.provider}",
        tenant=e.owner if e.found else None,
        attributes=json.loads(e.attributes_json) if e.found else {},
        message=e.message,
    )
    _resume(deps, inv, facts, out)


def on_usage(deps: DeciderDeps, e: ev.UsageReserved | ev.UsageRefused, out: Emitter) -> None:
    """A limit's usage answered (ADR 0079): once every limit has, decide the proposal that
    waited, with the usage known."""
    inv = usage.answered(e, out)
    if inv is None:
        return
    facts = NEW_RESOURCE if not inv.facts_json else ResourceFacts.from_json(inv.facts_json)
    _resume(deps, inv, facts, out)


def _resume(deps: DeciderDeps, inv: Invocation, facts: ResourceFacts, out: Emitter) -> None:
    """Decide a proposal that waited for an answer (a description, the usage), from what
    its invocation kept; the checks that may have changed meanwhile run again."""
    p = ev.ToolCallProposed(
        event_id=inv.proposal_event_id,
        invocation_id=inv.invocation_id,
        partition_key=inv.partition_key,
        session_token="",
        tool=inv.tool,
        args_json=inv.args_json,
        idempotency_key=inv.idempotency_key,
        approval_id=inv.approval_id,
        evaluate_only=inv.evaluate_only,
        access_request=inv.access_request,
    )
    principal = Principal(
        inv.actor,
        inv.tenant,
        tuple(inv.roles),
        inv.session_id,
        inv.session_expires_at,
        inv.agent,
        tuple(inv.delegation),
    )

    def decide() -> None:
        if out.now_ms >= principal.expires_at:  # the session ran out while we asked
            raise Rejection(Code.UNAUTHENTICATED, "invalid session token: token expired")
        spec = deps.profile.tool(inv.tool)
        if spec is None:
            raise Rejection(Code.UNKNOWN_TOOL, f"no tool named {inv.tool!r} in the catalog")
        deps.freezes.check(spec.name, principal.tenant, principal.user)  # ADR 0054
        deps.pins.check(spec.name, spec.pin)  # ADR 0066
        args = json.loads(inv.args_json)
        _decide_policy(deps, p, principal, spec, args, inv.target, facts, out)

    _rejecting(p, out, _Who(principal), decide)


def _rejecting(p: ev.ToolCallProposed, out: Emitter, who: _Who, decide: Callable[[], None]) -> None:
    """Run ``decide``; a ``Rejection`` settles the invocation with its code (first failure),
    naming who asked as far as known (C9: the call's record, else its verified session)."""
    try:
        decide()
    except UnreadableRecord:
        raise  # dead-lettered by the runner, never decided
    except Rejection as r:
        known = out.state.invocations.get(p.invocation_id)
        principal = who.principal
        if known is not None:
            actor, tenant, agent, delegation = (
                known.actor,
                known.tenant,
                known.agent,
                tuple(known.delegation),
            )
        elif principal is not None:
            actor, tenant, agent, delegation = (
                principal.user,
                principal.tenant,
                principal.agent,
                principal.delegation,
            )
        else:
            actor, tenant, agent, delegation = "", "", "", ()
        out.emit(
            ev.ProposalRejected,
            code=r.code.value,
            message=r.message,
            tool=p.tool,
            actor=actor,
            tenant=tenant,
            details_json=canonical_json(r.details),
            session_digest=token_digest(p.session_token),
            agent=agent,
            delegation=delegation,
        )


def _decide_proposal(deps: DeciderDeps, p: ev.ToolCallProposed, out: Emitter, who: _Who) -> None:
    now = out.now_ms
    try:
        principal = deps.sessions.verify(p.session_token, now)  # C6: identity from the session
    except Rejection:
        # malformed_event precedes unauthenticated (docs/contract.md order of checks). Routing by
        # key needs the tenant: take the token's unverified claim, for routing only.
        claimed = peek_claim(p.session_token, "tenant")
        if claimed is not None or p.idempotency_key is None:
            _check_routing(p, claimed or "")
        raise
    # Who is acting, as early as we know it, so rejections are attributable (C9).
    who.principal = principal
    _check_routing(p, principal.tenant)
    if p.evaluate_only and p.idempotency_key is not None:
        # An evaluation is a question, never a call: nothing to replay.
        raise Rejection(Code.MALFORMED_EVENT, "an evaluation carries no idempotency key")
    if p.access_request != p.invocation_id.startswith(TASK_PREFIX):
        # ADR 0090: an access request's id, and only its, names it (the task endpoint
        # serves access requests alone).
        raise Rejection(
            Code.MALFORMED_EVENT, f"an access request's id, and only its, starts {TASK_PREFIX}"
        )
    if p.access_request and (not p.evaluate_only or p.approval_id is not None):
        # ADR 0090: an access request is an evaluation that asks for an approval; it
        # presents none (a re-evaluation does).
        raise Rejection(
            Code.MALFORMED_EVENT, "an access request is an evaluation and presents no approval"
        )
    spec = deps.profile.tool(p.tool)
    if spec is None:
        raise Rejection(Code.UNKNOWN_TOOL, f"no tool named {p.tool!r} in the catalog")
    _strict_record(deps, p)
    args = normalize_args(spec, deps.profile.entry_limits, p.args_json)  # C7: schema first
    args = check_identity(spec.identity_args, deps.profile.tenant_fields, args, principal)
    deps.freezes.check(spec.name, principal.tenant, principal.user)  # ADR 0054
    deps.pins.check(spec.name, spec.pin)  # ADR 0066
    target = target_of(spec, args)
    facts = _static_facts(deps, spec, target)
    if facts is None:
        # C7: the profile does not say who owns the target; its system of record does.
        # Ask it through an event (the decider stays pure; replay reads the answer).
        # The request carries what the proposal is decided from once described (parked:
        # ``Phase.DESCRIBING``, ``evolve``).
        out.emit(
            ev.ResourceDescriptionRequested,
            tool=spec.name,
            provider=spec.provider,
            **parked_fields(p, principal, target, args),
        )
        return
    _decide_policy(deps, p, principal, spec, args, target, facts, out)


def _static_facts(deps: DeciderDeps, spec: ToolSpec, target: str) -> ResourceFacts | None:
    """What the profile says about the target, or None when the provider must be asked.

    A call that creates a resource acts in the session tenant; a target the profile's
    static ``resources`` globs claim belongs to that tenant (an optional override)."""
    if spec.target_arg is None:
        return NEW_RESOURCE
    owner = deps.profile.owner_of(target) if target else None
    if owner is not None:
        return ResourceFacts(source="profile", tenant=owner, attributes={})
    return None


def _decide_policy(
    deps: DeciderDeps,
    p: ev.ToolCallProposed,
    principal: Principal,
    spec: ToolSpec,
    args: dict[str, Any],
    target: str,
    facts: ResourceFacts,
    out: Emitter,
) -> None:
    now = out.now_ms
    limits = deps.profile.limits_of(spec.name)
    waited = out.state.invocations.get(p.invocation_id)
    # An evaluation reserves no usage: it is a question, and answers the policy alone.
    if limits and not p.evaluate_only and (waited is None or not waited.usage):
        # ADR 0079: ask the usage first, so that the policy decides with it in one step.
        facts_json = "" if facts is NEW_RESOURCE else facts.to_json()
        parked = parked_fields(p, principal, target, args) | {"facts_json": facts_json}
        usage.ask(p, spec.name, principal, args, parked, limits, out)
        return
    held = () if waited is None else waited.usage
    decision = deps.policy.decide(  # C1, C2, C3, C7
        principal, spec, target, args, facts, usage=usage.context(waited) if held else None
    )
    a_hash = args_hash(args)
    fingerprint = request_fingerprint(spec.name, target, args)
    high = spec.is_high_impact(args)
    confirmation = spec.confirmation_for(args)
    jti = _peek_jti(p.approval_id)
    out.emit(
        ev.PolicyDecided,
        actor=principal.user,
        tenant=principal.tenant,
        roles=principal.roles,
        tool=spec.name,
        target=target,
        args_json=canonical_json(args),
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
        resource_json=None if facts is NEW_RESOURCE else facts.to_json(),
        session_id=principal.session_id or None,
        session_digest=token_digest(p.session_token),
        agent=principal.agent,
        delegation=principal.delegation,
        evaluate_only=p.evaluate_only,
        # Taken from the catalog entry now (ADR 0029, 0030): a profile reloaded while the
        # approval is pending does not change what was asked.
        approver_roles=tuple(spec.approvers),
        allow_self_approval=spec.allow_self_approval,
        approval_ttl_ms=spec.approval_ttl_seconds * 1000,
        # An evaluation never runs: an access request's approval continues nothing.
        continue_on_approval=spec.continue_on_approval and not p.evaluate_only,
        require_dry_run=spec.require_dry_run,
        approvals_required=spec.approvals_for(args),
        access_request=p.access_request,
    )
    inv = out.state.invocations[p.invocation_id]
    if p.evaluate_only:
        # ADR 0083: the decision is the answer, recorded like any; nothing runs, no
        # provider is asked for an execution, no key is held (the outcome: ``evolve``).
        if inv.outcome != Code.APPROVAL_REQUIRED.value:
            return
        if p.access_request:
            # ADR 0090: the confirmation is asked for as for a call (approvers, quorum,
            # the dry-run the approvers see); its approval continues nothing.
            if (missing := deps.profile.dry_run_missing(spec)) is not None:
                raise Rejection(Code.DRY_RUN_UNAVAILABLE, missing)
            authorize(inv, spec, None, out)
        elif p.approval_id is not None:
            # ADR 0090: a re-evaluation presenting an access request's approval.
            confirm_evaluation(deps, inv, spec, p, out)
        return
    if not decision.allowed:
        return  # C12: tool_forbidden never reaches a provider
    claims = presented_approval(deps, p, now)  # approval_missing / approval_expired
    if claims is not None and check_approval(inv, claims, p, out):
        return  # a replay of the very call the approval authorized
    rec = out.state.keys.get(p.idempotency_key) if p.idempotency_key is not None else None
    if rec is not None:
        on_known_key(deps, inv, rec, claims, out)
        return
    if (missing := deps.profile.dry_run_missing(spec)) is not None:
        raise Rejection(Code.DRY_RUN_UNAVAILABLE, missing)  # C5: no dry-run, no call
    by_approver = claims is not None and claims.confirmation == "approver"
    needed = None
    if usage.check(inv, by_approver):  # limit_exceeded (ADR 0079)
        # Over a limit an approver may lift: this call needs one, who sees the usage.
        needed = Confirmation.APPROVER.value
    authorize(inv, spec, claims, out, confirmation=needed)


def _check_routing(p: ev.ToolCallProposed, tenant: str) -> None:
    """Partition-local checks need the right partition (docs/contract.md "Shape").

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


def _peek_jti(approval_id: str | None) -> str | None:
    """The presented approval's id for the record; verification happens after policy."""
    return peek_claim(approval_id, "jti") if approval_id is not None else None


__all__ = ["on_described", "on_proposed"]
