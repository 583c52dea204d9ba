"""An invocation's idempotency-key record, and the same-key calls waiting on it (C8).

A key's record names the call it authorized; calls that reuse the key while that call
is in flight wait on it and get its stored result replayed (``replayed``), never a
second authorization.
"""

from __future__ import annotations

from callgate.decider.emitter import Emitter
from callgate.decider.state import DeciderState, Invocation, KeyRecord, Phase
from callgate.domain import events as ev
from callgate.domain.codes import Code


def key_record(state: DeciderState, inv: Invocation) -> KeyRecord | None:
    return state.keys.get(inv.idempotency_key) if inv.idempotency_key is not None else None


def set_key_status(state: DeciderState, inv: Invocation, status: str) -> None:
    rec = key_record(state, inv)
    if rec is not None and rec.invocation_id == inv.invocation_id:
        rec.status = status


def serve_waiters(state: DeciderState, rec: KeyRecord, out: Emitter) -> None:
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


__all__ = ["key_record", "serve_waiters", "set_key_status"]
