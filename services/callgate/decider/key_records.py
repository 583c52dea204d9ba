"""An invocation's idempotency-key record, and the same-key calls waiting on it (C8).

A key's record names the call it authorized; calls that reuse the key while that call
is in flight wait on it and get its stored result replayed (``replayed``), never a
second authorization. The record changes only by ``evolve``; these rules emit.
"""

from __future__ import annotations

from callgate.decider.emitter import Emitter
from callgate.decider.state import Invocation, KeyRecord, KeyStatus, key_record
from callgate.domain import events as ev


def serve_waiters(rec: KeyRecord, out: Emitter) -> None:
    """Replay the settled original to each call waiting on its key (each leaves the list)."""
    for waiter in rec.waiters:
        out.emit(
            ev.ReplayServed,
            invocation_id=waiter,
            original_invocation_id=rec.invocation_id,
            original_outcome=rec.outcome,
            result_json=rec.result_json,
        )


def request_reconciliation(rec: KeyRecord, waiter: Invocation, out: Emitter) -> None:
    """C12: ask the provider what became of the key's uncertain call before ``waiter`` (a
    retry under the key, waiting on it) may run; the key is ``reconciling`` meanwhile."""
    original = out.state.invocations.get(rec.invocation_id)
    out.emit(
        ev.ReconciliationRequested,
        invocation_id=waiter.invocation_id,
        tenant=waiter.tenant,
        # The original call's user: the lookup asks the upstream as it (the same user, by
        # the key record's binding), in its name.
        actor=(original or waiter).actor,
        agent=(original or waiter).agent,
        delegation=tuple((original or waiter).delegation),
        tool=rec.tool,
        target=rec.target,
        args_json=original.args_json if original else waiter.args_json,
        execution_token=rec.execution_token,
        original_invocation_id=rec.invocation_id,
        policy_version=original.policy_version if original else waiter.policy_version,
    )


def on_lookup_failed(waiter: Invocation, e: ev.ExecutionUncertain, out: Emitter) -> None:
    """C12: a retry's reconciliation could not learn what became of the original call (the
    provider unreachable, reset, timed out): the executor answered that retry
    ``outcome_uncertain`` (folded by ``evolve``). The original stays uncertain: the next
    call waiting on the key asks again, or, none waiting, the next retry under the key
    does; a key left ``reconciling`` would keep every later retry under it waiting with no
    answer. ``waiter`` is the call as it was before ``e``."""
    asked = key_record(out.before, waiter)
    if (
        asked is None
        or asked.status != KeyStatus.RECONCILING
        or asked.execution_token != e.execution_token
        or waiter.invocation_id not in asked.waiters
    ):
        return
    rec = key_record(out.state, waiter)
    following = [out.state.invocations.get(w) for w in rec.waiters] if rec is not None else []
    nxt = next((w for w in following if w is not None), None)
    if rec is not None and nxt is not None:
        request_reconciliation(rec, nxt, out)


__all__ = ["on_lookup_failed", "request_reconciliation", "serve_waiters"]
