"""The records ``evolve`` replaces, never changes: a state with one invocation, key record
or approval use put in its place, and the changes several folds share (ADR 0092)."""

from __future__ import annotations

from typing import Any

from callgate.decider.state import (
    ApprovalUse,
    DeciderState,
    Invocation,
    KeyRecord,
    KeyStatus,
    evolved,
    key_record,
)

# The state is built positionally, with only the mapping that changed copied; a record is
# changed by ``evolved`` (a named tuple's ``_replace``, without its Python work).


def put(state: DeciderState, inv: Invocation) -> DeciderState:
    invocations = {**state.invocations, inv.invocation_id: inv}
    return DeciderState(invocations, state.keys, state.approvals, state.decisions_seen)


def put_key(state: DeciderState, key: str, rec: KeyRecord | None) -> DeciderState:
    keys = dict(state.keys)
    if rec is None:
        del keys[key]
    else:
        keys[key] = rec
    return DeciderState(state.invocations, keys, state.approvals, state.decisions_seen)


def put_use(state: DeciderState, jti: str, use: ApprovalUse) -> DeciderState:
    approvals = {**state.approvals, jti: use}
    return DeciderState(state.invocations, state.keys, approvals, state.decisions_seen)


def with_key(state: DeciderState, inv: Invocation, **changes: Any) -> DeciderState:
    """``inv``'s key record with ``changes`` (none: unchanged)."""
    rec = key_record(state, inv)
    if rec is None:
        return state
    return put_key(state, inv.idempotency_key or "", evolved(rec, **changes))


def with_own_key(state: DeciderState, inv: Invocation, **changes: Any) -> DeciderState:
    """``inv``'s key record with ``changes``, when ``inv`` is the call its key names."""
    rec = key_record(state, inv)
    if rec is None or rec.invocation_id != inv.invocation_id:
        return state
    return put_key(state, inv.idempotency_key or "", evolved(rec, **changes))


def authorized(state: DeciderState, inv: Invocation) -> DeciderState:
    """C8: the call passed every check, so its key names it: a record for a key not held
    (or held by an expired approval's call), ``executing`` until its next step says."""
    key = inv.idempotency_key
    if key is None:
        return state
    rec = state.keys.get(key)
    if rec is not None and (
        rec.status != KeyStatus.EXPIRED or rec.invocation_id == inv.invocation_id
    ):
        return state
    fresh = KeyRecord(
        actor=inv.actor,
        tool=inv.tool,
        target=inv.target,
        fingerprint=inv.fingerprint,
        invocation_id=inv.invocation_id,
        status=KeyStatus.EXECUTING,
    )
    return put_key(state, key, fresh)


def without_waiter(state: DeciderState, inv: Invocation) -> DeciderState:
    rec = key_record(state, inv)
    if rec is None or inv.invocation_id not in rec.waiters:
        return state
    waiters = tuple(w for w in rec.waiters if w != inv.invocation_id)
    return put_key(state, inv.idempotency_key or "", evolved(rec, waiters=waiters))


def consume(state: DeciderState, jti: str, inv: Invocation) -> DeciderState:
    """C11: the approval is used by ``inv`` (single use)."""
    use = state.approvals.get(jti)
    if use is None:
        return state
    return put_use(
        state, jti, evolved(use, consumed_by=inv.invocation_id, consumer_key=inv.idempotency_key)
    )


__all__ = [
    "authorized",
    "consume",
    "put",
    "put_key",
    "put_use",
    "with_key",
    "with_own_key",
    "without_waiter",
]
