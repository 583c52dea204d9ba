"""What every use case shares: the composition root's ports, the backend, and how a
session is verified as a reader or an operator."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from callgate.application.answers import (
    answer_of,
    is_final,
)
from callgate.application.ports import Backend, Ports
from callgate.domain.access_requests import TASK_PREFIX
from callgate.domain.codes import Code, Rejection
from callgate.domain.limits import check_text_field, check_value, parse_args
from callgate.domain.principal import Principal
from callgate.domain.scope import OPERATOR_ROLE


class UseCases:
    """The ports every use case reads: the composition root's (``app``) and the backend."""

    def __init__(self, app: Ports, backend: Backend) -> None:
        self.app = app
        self.backend = backend

    def _routing_tenant(self, session: str) -> str | None:
        """The tenant an idempotency key is scoped by, for routing: the verified session's
        (an issuer's claims mapping may take it from another claim, or a constant, ADR
        0078); ``None`` for a token that does not verify (routed by its unverified
        ``tenant`` claim, and refused by the decider in its order of checks)."""
        try:
            return self.app.session_verifier.verify(session, self.app.clock()).tenant
        except Rejection:
            return None

    def _reader(self, session: str) -> Principal:
        """The verified reader (``unauthenticated`` otherwise): reads are tenant-scoped."""
        return self.app.session_verifier.verify(session, self.app.clock())

    def _status(self, invocation_id: str) -> dict[str, Any] | None:
        return self.backend.view("status", invocation_id)

    def _operator(self, session: str, command: str) -> Principal:
        reader = self._reader(session)
        if not reader.has_any_role((OPERATOR_ROLE,)):
            raise Rejection(Code.OPERATOR_REQUIRED, f"{command} needs the {OPERATOR_ROLE} role")
        return reader

    def is_final(self, status: Mapping[str, Any]) -> bool:
        """``is_final``, knowing from the catalog whether the tool's calls continue. An
        access request's approval continues nothing (ADR 0090): granted, it is final."""
        if str(status.get("invocation_id") or "").startswith(TASK_PREFIX):
            return is_final(status, False)
        spec = self.app.profile.tool(str(status.get("tool") or ""))
        return is_final(status, None if spec is None else spec.continue_on_approval)

    def _entry_checks(
        self,
        session: str,
        tool: str,
        args: Mapping[str, Any] | str,
        idempotency_key: str | None,
        approval_id: str | None,
    ) -> str:
        """The limits of every entry; the arguments' JSON text."""
        limits = self.app.profile.entry_limits
        if isinstance(args, str):
            parse_args(args, limits.max_args_bytes, limits.max_depth)
            args_json = args
        else:
            args_json = check_value(args, limits.max_args_bytes, limits.max_depth)
        for name, value in (
            ("session", session),
            ("tool", tool),
            ("idempotency_key", idempotency_key),
            ("approval_id", approval_id),
        ):
            if value is not None:
                check_text_field(name, value)
        return args_json

    def answer(self, invocation_id: str) -> dict[str, Any]:
        """The ``propose`` answer shape for an invocation this client proposed, from its
        status (the id is bound to the proposing session: only its holder knows it)."""
        return answer_of(invocation_id, self._status(invocation_id))

    def close(self) -> None:
        self.backend.close()
