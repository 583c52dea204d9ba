"""Approval UIs' use cases: the pending approvals of a tenant, and an approver's grant,
denial or an actor's withdrawal, answered by the decider."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from callgate.application.answers import (
    answered,
    final_answer,
)
from callgate.application.base import UseCases
from callgate.domain import events as ev
from callgate.domain.canonical import canonical_json
from callgate.domain.codes import Code, Rejection
from callgate.domain.scope import bound_id, may_read


class Approvals(UseCases):
    """Approval UIs' use cases: pending approvals, grant, deny, withdraw."""

    def pending(self, session: str) -> list[dict[str, Any]]:
        """Pending approvals of the session's tenant (every tenant for an operator)."""
        reader = self._reader(session)
        rows = [
            v for _, v in self.backend.view_items("pending") if may_read(reader, v.get("tenant"))
        ]
        return sorted(rows, key=lambda r: (r.get("requested_at", 0), r["invocation_id"]))

    def resumable(self, session: str, tool: str, args: Mapping[str, Any]) -> str | None:
        """The pending approval of the session's principal for the same call: the same
        tool, actor and tenant, and arguments that normalize to the same hash (the one the
        approval binds, C11); the newest, unexpired. This is how the same call made again
        finds its invocation from any process (ADR 0029); None when there is none, or
        when the session or the arguments are refused (the call is then proposed and
        refused as usual)."""
        from callgate.domain.arguments import normalize_args
        from callgate.domain.canonical import args_hash

        spec = self.app.profile.tool(tool)
        if spec is None:
            return None
        try:
            principal = self._reader(session)
            normalized = normalize_args(spec, self.app.profile.entry_limits, canonical_json(args))
        except (Rejection, ValueError, TypeError):
            return None
        wanted, now = args_hash(normalized), self.app.clock()
        rows = [
            row
            for row in self.pending(session)
            if row.get("tool") == tool
            and row.get("tenant") == principal.tenant
            and row.get("actor") == principal.user
            and row.get("args_hash") == wanted
            and int(row.get("expires_at") or 0) > now
        ]
        return str(rows[-1]["invocation_id"]) if rows else None

    def approve(self, invocation_id: str, session: str, timeout_s: float = 30.0) -> dict[str, Any]:
        return self._decide(invocation_id, session, "grant", "", timeout_s)

    def deny(
        self, invocation_id: str, session: str, reason: str = "", timeout_s: float = 30.0
    ) -> dict[str, Any]:
        return self._decide(invocation_id, session, "deny", reason, timeout_s)

    def withdraw(
        self, invocation_id: str, session: str, reason: str = "", timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """The actor withdraws their own pending call (MCP ``tasks/cancel``, ADR 0086): the
        decider records it as denied, so it never runs; ``not_pending`` once decided."""
        return self._decide(invocation_id, session, ev.WITHDRAW, reason, timeout_s)

    def _decide(
        self, invocation_id: str, session: str, decision: str, reason: str, timeout_s: float
    ) -> dict[str, Any]:
        submit = ev.ApprovalDecisionSubmitted(
            event_id=bound_id(session, uuid.uuid4().hex),
            invocation_id=invocation_id,
            partition_key=self._partition_key_of(invocation_id, session),
            correlation_id=invocation_id,
            occurred_at=self.app.clock(),
            producer="callgate-sdk",
            session_token=session,
            decision=decision,
            reason=reason,
        )
        deadline = time.monotonic() + timeout_s
        answer = self.backend.follow(submit, "decisions", submit.event_id, answered, timeout_s)
        if answer is None:
            raise TimeoutError(
                f"no answer to the {decision} of {invocation_id} within {timeout_s}s"
            )
        if answer.get("decision") == "rejected":
            err = answer["error"]
            raise Rejection(Code(err["code"]), err["message"])
        result = {k: v for k, v in answer.items() if v is not None}
        if "approval_id" in result:
            # ADR 0029: a granted approval continues the invocation; tell the approver
            # what became of it (bounded by the same timeout; a server may still be at it).
            status: dict[str, Any] | None = None

            def continued() -> bool:
                nonlocal status
                status = self._status(invocation_id)
                return status is not None and self.is_final(status)

            self.backend.wait(continued, max(0.0, deadline - time.monotonic()))
            if status is not None:
                result["outcome"] = final_answer(invocation_id, status)["outcome"]
        return result

    def _partition_key_of(self, invocation_id: str, session: str) -> str:
        """Where the decision goes: the invocation's partition key (the decider answers,
        ``not_pending`` when it is not pending). An invocation of another tenant than the
        session's is ``not_pending`` too: its existence is not revealed."""
        found = self.backend.partition_key_of(invocation_id)
        record = None if found is None else self.backend.view("pending", invocation_id)
        if found is not None and record is None:
            record = self._status(invocation_id)
        if (
            found is None
            or record is None
            or not may_read(self._reader(session), record.get("tenant"))
        ):
            raise Rejection(Code.NOT_PENDING, f"no invocation {invocation_id}")
        return found
