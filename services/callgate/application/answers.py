"""The answers of the client, in the one shape every surface gives (docs/contract.md,
"Command line"): a call's outcome from its status, a refusal before publishing, an
undecided call (never ``allowed``), and whether an invocation is final (ADR 0029)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from callgate.domain.codes import Code, Rejection


def settled(status: Mapping[str, Any]) -> bool:
    return bool(status.get("settled"))


def answered(decision: Mapping[str, Any]) -> bool:
    """The decider's answer to a decision; the grant that meets a quorum is answered by
    its ``granted`` record, which follows the ``recorded`` one (ADR 0030)."""
    if decision.get("decision") != "recorded":
        return True
    return int(decision.get("granted") or 0) < int(decision.get("required") or 0)


def is_final(status: Mapping[str, Any], continues: bool | None = None) -> bool:
    """Nothing more will happen to the invocation by itself (ADR 0029): settled, and not
    waiting on its approval (pending, or granted and continuing).

    ``continues``: whether the tool's calls continue once approved (the catalog's
    ``continue_on_approval``); when the caller knows it, a grant is not final until the
    call goes on (on Kafka the status can show the grant a step before that). Otherwise a
    grant is final unless the status already shows the invocation continuing.
    """
    if not status.get("settled"):
        return False
    if status.get("outcome") != Code.APPROVAL_REQUIRED.value:
        return True
    state = (status.get("approval") or {}).get("state")
    if state in (None, "pending"):
        return False  # pending, or its approval not shown in the status yet
    if state != "granted":
        return True
    if continues is not None:
        return not continues
    approved_by = status.get("approved_by") or {}
    return approved_by.get("approved_invocation_id") != status.get("invocation_id")


_DECIDED = {"denied": Code.APPROVAL_DENIED, "expired": Code.APPROVAL_EXPIRED}


def final_answer(invocation_id: str, status: Mapping[str, Any]) -> dict[str, Any]:
    """The ``propose`` answer, with a denied or expired approval as its own outcome."""
    out = answer_of(invocation_id, status)
    out["final"] = is_final(status)
    approval = status.get("approval") or {}
    code = _DECIDED.get(str(approval.get("state")))
    if out["outcome"] == Code.APPROVAL_REQUIRED.value and code is not None:
        reason = f": {approval['reason']}" if approval.get("reason") else ""
        out["outcome"] = code.value
        out["error"] = {
            "code": code.value,
            "message": f"the approval was {approval['state']}{reason}",
            "details": {"approver": approval.get("approver")},
        }
    return out


def refusal(rejection: Rejection) -> dict[str, Any]:
    """The ``propose`` answer of a call refused before it was published: the same shape as
    a refusal the decider made (``outcome`` equals ``error.code``), with no invocation id,
    for nothing was published (docs/contract.md, "Command line")."""
    error: dict[str, Any] = {"code": rejection.code.value, "message": rejection.message}
    if rejection.details:
        error["details"] = dict(rejection.details)
    return {
        "invocation_id": None,
        "outcome": rejection.code.value,
        "error": error,
        "settled": True,
    }


def undecided(invocation_id: str) -> dict[str, Any]:
    """The answer and status of a call no decision is recorded for (yet): its own code,
    never ``allowed``, which says that a policy permitted the call."""
    return {
        "invocation_id": invocation_id,
        "outcome": Code.PENDING_DECISION.value,
        "settled": False,
        "error": {
            "code": Code.PENDING_DECISION.value,
            "message": "no decision is recorded for this call yet; it is neither permitted nor "
            f"refused: ask `callgate status {invocation_id}` or `callgate wait {invocation_id}`",
            "details": {},
        },
    }


def answer_of(invocation_id: str, status: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``propose`` answer shape for an invocation, from its status value."""
    if status is None:
        return undecided(invocation_id)
    out: dict[str, Any] = {
        "invocation_id": invocation_id,
        "outcome": status["outcome"],
        "settled": bool(status.get("settled")),
    }
    if status.get("error"):
        out["error"] = status["error"]
    if status.get("result") is not None:
        out["result"] = status["result"]
    if status.get("dry_run") is not None:
        out["dry_run"] = status["dry_run"]
    approval = status.get("approval") or {}
    if approval.get("approval_id"):
        out["approval_id"] = approval["approval_id"]
    if status.get("replay_of"):
        out["replay_of"] = status["replay_of"]
    return out
