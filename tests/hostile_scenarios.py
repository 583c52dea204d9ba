"""The four classes of hostile-input defect (issue "hostile input never stalls a partition"),
as scenarios run through the SDK on every backend (embedded and Kafka).

1. ``poison_scenario``: a value the decider cannot represent (a number canonical JSON
   cannot hold, an escaped lone surrogate), sent as a raw record on ``requests``, gets a
   coded outcome and the partition keeps moving (a later call under the same key, hence
   the same partition, is decided).
2. ``cross_tenant_scenario``: another tenant reusing an invocation id, and an
   unauthenticated sender doing the same, neither overwrite its status nor block its
   approval; reads of status, pending and audit show only the reader's tenant.
3. ``self_approval_scenario``: the actor approving their own high-impact call under
   another spelling of their user id (case, full width, padding) is refused.
4. ``limits_scenario``: arguments over the limits (deep, huge, too precise, not valid
   Unicode, oversized) get ``invalid_arguments`` from the SDK before anything is published.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.codes import Code, Rejection
from callgate.domain.scope import OPERATOR_ROLE, bound_id
from callgate.surfaces.sdk import Gateway

SETTLE_S = 60.0
REFUND = {"order_id": "ORD-77", "amount_cents": 700, "currency": "EUR"}
DEPLOY = {"service": "billing", "version": "9.9.9", "environment": "production"}
DeadLetters = Callable[[], Sequence[ev.EventDeadLettered]]


def session(gate: Gateway, user: str, tenant: str, *roles: str) -> str:
    return gate.app.session_issuer.issue(user, tenant, list(roles), gate.app.clock())


def operator(gate: Gateway) -> str:
    return session(gate, "operator", "ops", OPERATOR_ROLE)


def raw_proposal(
    token: str,
    tool: str,
    args_json: str,
    tenant: str,
    key: str | None = None,
    invocation_id: str | None = None,
) -> ev.ToolCallProposed:
    """A request as a hand-written client puts it on ``requests`` (no SDK checks)."""
    inv = invocation_id or bound_id(token, uuid.uuid4().hex)
    return ev.ToolCallProposed(
        event_id=str(uuid.uuid4()),
        invocation_id=inv,
        partition_key=partition_key(tenant if key is not None else "", key, inv),
        session_token=token,
        tool=tool,
        args_json=args_json,
        idempotency_key=key,
    )


def settle(gate: Gateway, invocation_id: str, timeout_s: float = SETTLE_S) -> dict[str, Any]:
    ops = operator(gate)
    done = gate.backend.wait(
        lambda: bool((gate.status(invocation_id, ops) or {}).get("settled")), timeout_s
    )
    status = gate.status(invocation_id, ops)
    assert done and status is not None, f"{invocation_id} did not settle: {status}"
    return status


# --- 1. deterministic failures never stall a partition -----------------------------------------

POISON_ARGS = {
    "number-not-representable": '{"record_id": "REC-1", "fields": {"x": 1e400}}',
    "negative-infinity": '{"record_id": "REC-1", "fields": {"x": -1e999}}',
    "integer-beyond-ijson": '{"record_id": "REC-1", "fields": {"x": 123456789012345678901}}',
}


def poison_scenario(gate: Gateway, dead_letters: DeadLetters) -> None:
    """Each poison value on ``requests`` under one idempotency key (so one partition): a
    coded ``invalid_arguments`` that status reports, never ``allowed``; then a legitimate
    call under the same key, on the same partition, is still decided."""
    alice = session(gate, "alice", "acme", "support")
    key = f"poison-{uuid.uuid4().hex[:8]}"
    for name, args_json in POISON_ARGS.items():
        p = raw_proposal(alice, "records.update", args_json, "acme", key)
        gate.backend.publish([p])
        status = settle(gate, p.invocation_id)
        assert status["outcome"] == Code.INVALID_ARGUMENTS.value, (name, status)
        assert status["error"]["code"] == Code.INVALID_ARGUMENTS.value, (name, status)
    after = gate.propose(alice, "tickets.read", {"ticket_id": "T-1"}, key, timeout_s=SETTLE_S)
    assert after["outcome"] == Code.EXECUTED.value, after
    assert not [d for d in dead_letters() if d.partition_key.startswith("k-")], dead_letters()


# --- 2. identifiers a client chooses stay in its tenant ---------------------------------------


def cross_tenant_scenario(gate: Gateway, dead_letters: DeadLetters) -> None:
    alice = session(gate, "alice", "acme", "support")
    gina = session(gate, "gina", "globex", "support")
    key = f"xt-{uuid.uuid4().hex[:8]}"
    first = gate.propose(alice, "refunds.issue", REFUND, key, timeout_s=SETTLE_S)
    assert first["outcome"] == Code.APPROVAL_REQUIRED.value, first
    inv = first["invocation_id"]
    # The answer comes from the events log; the status view may follow a moment later.
    assert gate.backend.wait(lambda: gate.status(inv, alice) is not None, SETTLE_S)
    before = gate.status(inv, alice)
    assert before is not None and before["tenant"] == "acme"

    # gina reuses alice's invocation id under her own key; a junk token does the same
    gina_key = f"g-{uuid.uuid4().hex[:8]}"
    squat = raw_proposal(gina, "tickets.read", '{"ticket_id": "GT-1"}', "globex", gina_key, inv)
    junk = raw_proposal("junk", "tickets.read", '{"ticket_id": "T-1"}', "acme", "j", inv)
    gate.backend.publish([squat, junk])
    # behind them on the same partitions: when these settle, the squatters were processed
    for token, tenant, k in ((gina, "globex", gina_key), ("junk", "acme", "j")):
        later = raw_proposal(token, "tickets.read", '{"ticket_id": "T-2"}', tenant, k)
        gate.backend.publish([later])
        settle(gate, later.invocation_id)
    letters = [d for d in dead_letters() if d.invocation_id == inv]
    assert len(letters) >= 2 and {d.code for d in letters} == {Code.MALFORMED_EVENT.value}
    assert all("not bound" in d.reason for d in letters), letters

    now = gate.status(inv, alice)
    assert now is not None
    assert (now["tenant"], now["actor"], now["outcome"], now["partition_key"]) == (
        "acme",
        "alice",
        Code.APPROVAL_REQUIRED.value,
        before["partition_key"],
    )
    # reads are tenant-scoped: gina sees nothing of alice's invocation
    assert gate.status(inv, gina) is None
    assert gate.backend.wait(
        lambda: inv in {r["invocation_id"] for r in gate.pending(alice)}, SETTLE_S
    )
    assert inv not in {r["invocation_id"] for r in gate.pending(gina)}
    assert not [r for r in gate.audit(session=gina) if r["invocation_id"] == inv]
    with pytest.raises(Rejection) as refused:
        gate.approve(inv, gina, timeout_s=SETTLE_S)
    assert refused.value.code == Code.NOT_PENDING
    # and alice's approval is not blocked
    approval = gate.approve(inv, alice, timeout_s=SETTLE_S)
    assert approval["approval_id"]
    done = gate.wait(inv, alice, SETTLE_S)  # the approved call continues (ADR 0029)
    assert done["outcome"] == Code.EXECUTED.value, done


# --- 3. exact to grant, folded only to deny ---------------------------------------------------

# Look-alikes of rita: upper case, title case, full width, a Cyrillic i.
SPELLINGS = ("RITA", "Rita", "\uff52\uff49\uff54\uff41", "r\u0456ta")
# (user, tenant, roles) of approvers that are not acme's release managers exactly.
NOT_THE_APPROVER = (
    ("rob", "ACME", ("release-manager",), "another tenant"),
    ("rob", "acme", ("Release-Manager",), "needs one of the roles"),
    (" rita ", "acme", ("release-manager",), "claim 'sub'"),
)


def self_approval_scenario(gate: Gateway) -> None:
    """Separation of duties holds against look-alikes of the actor; another spelling of the
    tenant or role is not it; a padded user is not canonical."""
    rita = session(gate, "rita", "acme", "release", "release-manager")
    first = gate.propose(rita, "deploys.trigger", DEPLOY, f"d-{uuid.uuid4().hex[:8]}", None, 60)
    assert first["outcome"] == Code.APPROVAL_REQUIRED.value, first
    inv = first["invocation_id"]
    for spelling in SPELLINGS:
        other_rita = session(gate, spelling, "acme", "release-manager")
        with pytest.raises(Rejection) as refused:
            gate.approve(inv, other_rita, timeout_s=SETTLE_S)
        assert refused.value.code == Code.APPROVER_FORBIDDEN, spelling
        assert "look-alike" in refused.value.message
    for user, tenant, roles, says in NOT_THE_APPROVER:
        with pytest.raises(Rejection) as refused:
            gate.approve(inv, session(gate, user, tenant, *roles), timeout_s=SETTLE_S)
        assert refused.value.code in (Code.APPROVER_FORBIDDEN, Code.NOT_PENDING,
                                      Code.UNAUTHENTICATED), refused.value  # fmt: skip
        assert refused.value.code == Code.NOT_PENDING or says in refused.value.message
    status = gate.status(inv, rita)
    assert status is not None and status["approval"]["state"] == "pending", status


# Tenants and roles as a trusted issuer may sign them; each is another identifier than
# acme or admin (or not canonical): never access to acme's ticket or to users.delete.
SPELLED_SESSIONS = (
    ("ACME", "support", "tickets.read", '{"ticket_id": "T-1"}', Code.TOOL_FORBIDDEN),
    ("Acme", "support", "tickets.read", '{"ticket_id": "T-1"}', Code.TOOL_FORBIDDEN),
    ("acme ", "support", "tickets.read", '{"ticket_id": "T-1"}', Code.UNAUTHENTICATED),
    ("\uff41\uff43\uff4d\uff45", "support", "tickets.read", '{"ticket_id": "T-1"}',
     Code.TOOL_FORBIDDEN),
    ("acme", "ADMIN", "users.delete", '{"user_id": "U-1"}', Code.TOOL_FORBIDDEN),
    ("acme", "Admin", "users.delete", '{"user_id": "U-1"}', Code.TOOL_FORBIDDEN),
    ("acme", " admin", "users.delete", '{"user_id": "U-1"}', Code.UNAUTHENTICATED),
)  # fmt: skip


def spelled_identity_scenario(gate: Gateway) -> None:
    """Raw records on ``requests`` from sessions of other spellings of acme and admin."""
    before = len(gate.effects())
    for tenant, role, tool, args_json, code in SPELLED_SESSIONS:
        token = session(gate, "ivan", tenant, role)
        p = raw_proposal(token, tool, args_json, tenant)
        gate.backend.publish([p])
        status = settle(gate, p.invocation_id)
        assert status["outcome"] == code.value, (tenant, role, status)
    assert len(gate.effects()) == before


# Arguments two JSON parsers could read differently: dead-lettered, never decided.
UNREADABLE_ARGS = {
    "duplicate-key": ('{"ticket_id": "GT-1", "ticket_id": "T-1"}', "duplicate key"),
    "duplicate-after-unescaping": ('{"ticket_id": "GT-1", "ticket\\u005fid": "T-1"}',
                                   "duplicate key"),
    "nan": ('{"ticket_id": NaN}', "NaN"),
    "escaped-lone-surrogate": ('{"ticket_id": "\\ud800"}', "surrogate"),
}  # fmt: skip


def strict_record_scenario(gate: Gateway, dead_letters: DeadLetters) -> None:
    """Each on ``requests`` under one key: dead-lettered with its reason, the caller told
    ``invalid_arguments``; a legitimate call on the same partition is still decided."""
    alice = session(gate, "alice", "acme", "support")
    key = f"strict-{uuid.uuid4().hex[:8]}"
    for name, (args_json, says) in UNREADABLE_ARGS.items():
        p = raw_proposal(alice, "tickets.read", args_json, "acme", key)
        gate.backend.publish([p])
        status = settle(gate, p.invocation_id)
        assert status["outcome"] == Code.INVALID_ARGUMENTS.value, (name, status)
        assert status["error"]["details"] == {"dead_lettered": "true"}, (name, status)
        (letter,) = [d for d in dead_letters() if d.invocation_id == p.invocation_id]
        assert says in letter.reason and letter.code == Code.INVALID_ARGUMENTS.value, letter
    after = gate.propose(alice, "tickets.read", {"ticket_id": "T-1"}, key, timeout_s=SETTLE_S)
    assert after["outcome"] == Code.EXECUTED.value, after


# --- 4. limits at every entry ---------------------------------------------------------------


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"n": value}
    return {"record_id": "REC-1", "fields": value}


def limits_scenario(gate: Gateway) -> None:
    """The SDK refuses, with ``invalid_arguments`` and before publishing, what no entry may
    pass: deep nesting, numbers canonical JSON cannot represent, lone surrogates, huge
    text (2 MB, over a broker's record size too)."""
    alice = session(gate, "alice", "acme", "support")
    hostile: dict[str, dict[str, Any] | str] = {
        "deep-dict": _deep(10_000),
        "deep-text": '{"record_id": "REC-1", "fields": ' + "[" * 5000 + "]" * 5000 + "}",
        "infinite": {"record_id": "REC-1", "fields": {"x": float("inf")}},
        "nan": {"record_id": "REC-1", "fields": {"x": float("nan")}},
        "huge-int": {"record_id": "REC-1", "fields": {"x": 10**30}},
        "5000-digits": '{"record_id": "REC-1", "fields": {"x": ' + "9" * 5000 + "}}",
        "lone-surrogate": {"record_id": "REC-1", "fields": {"x": "\ud800"}},
        "oversized": {"record_id": "REC-1", "fields": {"x": "A" * 2_000_000}},
    }
    before = len(gate.effects())
    for name, args in hostile.items():
        refused = gate.propose(alice, "records.update", args, timeout_s=5)
        assert refused["invocation_id"] is None, name  # nothing published
        assert refused["outcome"] == refused["error"]["code"] == Code.INVALID_ARGUMENTS, name
    bad_tool = gate.propose(alice, "tickets.re\udcffad", {"ticket_id": "T-1"}, timeout_s=5)
    assert bad_tool["outcome"] == bad_tool["error"]["code"] == Code.INVALID_ARGUMENTS
    assert len(gate.effects()) == before
    ok = gate.propose(alice, "tickets.read", {"ticket_id": "T-1"}, timeout_s=SETTLE_S)
    assert ok["outcome"] == Code.EXECUTED.value, ok
