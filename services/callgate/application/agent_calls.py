"""Agents' calls: propose, evaluate (AuthZEN), request access (ARAP), and wait for the
final outcome. Identity comes from the session token the decider verifies (C6): nothing
here decides."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from callgate.domain import events as ev
from callgate.domain.access_requests import TASK_PREFIX
from callgate.domain.codes import Code, Rejection
from callgate.domain.scope import bound_id, is_bound, may_read

if TYPE_CHECKING:
    from callgate.providers.channels import Channel

    pass


from callgate.application.answers import (
    answer_of,
    final_answer,
    refusal,
    settled,
    undecided,
)
from callgate.application.base import UseCases
from callgate.application.routing import route


class AgentCalls(UseCases):
    """Agents' calls: propose, evaluate, request access, wait."""

    def propose(
        self,
        session: str,
        tool: str,
        args: Mapping[str, Any] | str,
        idempotency_key: str | None = None,
        approval_id: str | None = None,
        timeout_s: float = 30.0,
        wait: float | None = None,
        traceparent: str | None = None,
        trace_attributes: Mapping[str, Any] | None = None,
        channel: Channel | None = None,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Publish a proposal and wait until it settles (docs/contract.md "Command line").

        Traced (``[tracing]``, ADR 0036), the call is the span ``execute_tool {tool}``, a
        child of ``traceparent`` (the caller's W3C trace context) when given;
        ``trace_attributes`` are the surface's own (MCP's ``mcp.method.name``, ...).

        With ``wait`` (seconds), a call that needs approval is waited on further until
        its final outcome (``Gateway.wait``, ADR 0029): executed or failed once approved,
        ``approval_denied``, ``approval_expired``, or still ``approval_required`` (with the
        invocation id to wait on again) when ``wait`` runs out; ``on_change`` sees each
        status meanwhile (``Gateway.wait``).

        The limits of every entry (``callgate.domain.limits``) run first: arguments that
        break them, or text that cannot be encoded, are refused before anything is
        published, answered in the one shape of a refused call (``refusal``) with no
        invocation id: ``{"outcome": "invalid_arguments", "error": {...}}``. The
        invocation id is bound to ``session`` (``callgate.domain.scope``), so no other
        session can address it.

        ``channel`` receives what the upstream sends during the call (progress, log
        messages, its requests to the agent) while this method waits, when the call is
        executed in this process (``providers.channels``).
        """
        tracing = self.app.tracing
        if tracing is None:
            return self._propose(
                session, tool, args, idempotency_key, approval_id, timeout_s, wait, channel,
                on_change,
            )  # fmt: skip
        with tracing.proposal(tool, traceparent, trace_attributes) as span:
            answer = self._propose(
                session, tool, args, idempotency_key, approval_id, timeout_s, wait, channel,
                on_change,
            )  # fmt: skip
            if answer.get("invocation_id"):
                span.set_attribute("callgate.invocation_id", str(answer["invocation_id"]))
            if answer.get("outcome"):
                span.set_attribute("callgate.outcome", str(answer["outcome"]))
            return answer

    def _propose(
        self,
        session: str,
        tool: str,
        args: Mapping[str, Any] | str,
        idempotency_key: str | None,
        approval_id: str | None,
        timeout_s: float,
        wait: float | None,
        channel: Channel | None = None,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        try:
            args_json = self._entry_checks(session, tool, args, idempotency_key, approval_id)
        except Rejection as r:
            return refusal(r)
        invocation_id = bound_id(session, uuid.uuid4().hex)
        proposal = ev.ToolCallProposed(
            event_id=str(uuid.uuid4()),
            invocation_id=invocation_id,
            partition_key=route(
                session,
                idempotency_key,
                approval_id,
                invocation_id,
                self._routing_tenant(session) if idempotency_key is not None else None,
            ),
            correlation_id=invocation_id,
            occurred_at=self.app.clock(),
            producer="callgate-sdk",
            session_token=session,
            tool=tool,
            args_json=args_json,
            idempotency_key=idempotency_key,
            approval_id=approval_id,
        )
        if channel is not None:
            self.app.channels.open(invocation_id, channel)
        try:
            status = self.backend.follow(proposal, "status", invocation_id, settled, timeout_s)
        finally:
            if channel is not None:
                self.app.channels.close(invocation_id)
        if wait is not None and status is not None:
            # Waited on, the answer has one shape whether the first status seen is final
            # already (an approval given before the follower read the request's events)
            # or not: ``final_answer``, as ``wait`` gives.
            if not self.is_final(status):
                return self.wait(invocation_id, session, wait, on_change)
            return final_answer(invocation_id, status)
        return answer_of(invocation_id, status)

    def evaluate(
        self,
        calls: Sequence[tuple[str, str, Mapping[str, Any]]],
        timeout_s: float = 30.0,
        approvals: Sequence[str | None] | None = None,
    ) -> list[dict[str, Any]]:
        """Decide each ``(session, tool, args)`` as that session's call, and run none
        (ADR 0083).

        Each is a proposal with ``evaluate_only``: the decider takes it through the same
        checks as any call (session, catalog, schema, identity, freeze, pin, policy) and
        records its ``PolicyDecided`` (or the refusal), which settles it as ``permitted``,
        ``approval_required`` or a refusal; the audit and ``policy simulate`` see it like
        any decision. All are published in one append and waited on together: a batch is
        one round trip. The answers are in ``propose``'s shape, in order; one refused by
        the limits of every entry has no invocation id (nothing was published for it).

        ``approvals[i]``, when given, is the approval artifact of an access request that
        the ``i``-th evaluation presents (ARAP re-evaluation, ADR 0090): it is routed to
        that request's partition and waited on past ``approval_required`` until the
        approval is confirmed (``permitted``) or refused."""
        presented = list(approvals) if approvals is not None else [None] * len(calls)
        if len(presented) != len(calls):
            raise ValueError("one approval (or None) per evaluation")
        answers: list[dict[str, Any] | None] = []
        proposals: list[ev.ToolCallProposed] = []
        for (session, tool, args), approval_id in zip(calls, presented, strict=True):
            try:
                args_json = self._entry_checks(session, tool, args, None, approval_id)
            except Rejection as r:
                answers.append(refusal(r))
                continue
            proposals.append(self._evaluation(session, tool, args_json, approval_id))
            answers.append(None)
        if proposals:
            self.backend.publish(proposals)
            confirming = {p.invocation_id for p in proposals if p.approval_id is not None}

            def decided(invocation_id: str) -> bool:
                status = self._status(invocation_id) or {}
                if invocation_id in confirming and status.get("outcome") == "approval_required":
                    return False  # the approval is being confirmed (a dry-run may run)
                return settled(status)

            ids = [p.invocation_id for p in proposals]
            self.backend.wait(lambda: all(decided(i) for i in ids), timeout_s)
        published = iter(proposals)
        return [a if a is not None else self.answer(next(published).invocation_id) for a in answers]

    def request_access(
        self, session: str, tool: str, args: Mapping[str, Any], timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """An ARAP access request (ADR 0090): the evaluation of ``session``'s call, decided
        again, that, when it needs a confirmation, asks for it as a call does (the tool's
        approvers and quorum, the dry-run they see). Its approval continues nothing: an
        evaluation presenting it is ``permitted`` once. The answer is ``propose``'s shape;
        ``approval_required`` means the approval is requested (or its dry-run under way)."""
        try:
            args_json = self._entry_checks(session, tool, args, None, None)
        except Rejection as r:
            return refusal(r)
        proposal = self._evaluation(session, tool, args_json, None, access_request=True)
        status = self.backend.follow(proposal, "status", proposal.invocation_id, settled, timeout_s)
        return answer_of(proposal.invocation_id, status)

    def _evaluation(
        self,
        session: str,
        tool: str,
        args_json: str,
        approval_id: str | None,
        access_request: bool = False,
    ) -> ev.ToolCallProposed:
        nonce = (TASK_PREFIX if access_request else "") + uuid.uuid4().hex
        invocation_id = bound_id(session, nonce)
        return ev.ToolCallProposed(
            event_id=str(uuid.uuid4()),
            invocation_id=invocation_id,
            partition_key=route(session, None, approval_id, invocation_id),
            correlation_id=invocation_id,
            occurred_at=self.app.clock(),
            producer="callgate-authzen",
            session_token=session,
            tool=tool,
            args_json=args_json,
            approval_id=approval_id,
            evaluate_only=True,
            access_request=access_request,
        )

    def answer_status(self, invocation_id: str) -> dict[str, Any] | None:
        """The status of an invocation this client proposed (as ``answer``, whose id only
        the proposing session's holder knows)."""
        return self._status(invocation_id)

    def wait(
        self,
        invocation_id: str,
        session: str,
        timeout_s: float = 30.0,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """The invocation's final outcome, waiting up to ``timeout_s`` for it (ADR 0029).

        Final: settled, and not an approval that is pending or granted and continuing.
        A denied or expired approval is answered as ``approval_denied`` /
        ``approval_expired``; at the timeout the answer is the current one (usually
        ``approval_required``, ``settled`` true, ``final`` false). ``on_change`` is
        called with each new status value (progress on a terminal, SSE). Only the
        session's tenant can be waited on (``not_found`` otherwise).
        """
        reader = self._reader(session)
        last: dict[str, Any] | None = None

        def done() -> bool:
            nonlocal last
            status = self._status(invocation_id)
            if status is not None and not may_read(reader, status.get("tenant")):
                raise Rejection(Code.NOT_FOUND, f"no invocation {invocation_id}")
            if status != last and status is not None and on_change is not None:
                on_change(status)
            last = status
            return status is not None and self.is_final(status)

        self.backend.wait(done, timeout_s)
        if last is None:
            if is_bound(invocation_id, session):  # formed by this session: not decided yet
                return {**undecided(invocation_id), "final": False}
            raise Rejection(Code.NOT_FOUND, f"no invocation {invocation_id}")
        return final_answer(invocation_id, last)
