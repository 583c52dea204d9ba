"""Reads, tenant-scoped by the verified session: status, audit, usage, effects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from callgate.domain.principal import Principal
from callgate.domain.scope import is_bound, may_read

if TYPE_CHECKING:
    from callgate_projections.audit import VerifyResult

    pass


from callgate.application.answers import (
    undecided,
)
from callgate.application.base import UseCases


class Queries(UseCases):
    """Reads, tenant-scoped by the verified session."""

    def status(self, invocation_id: str, session: str) -> dict[str, Any] | None:
        """An invocation's status, if it belongs to the session's tenant (any tenant for a
        session with the operator role, ``callgate.domain.scope.OPERATOR_ROLE``); None when
        nothing is recorded of it (``status_or_undecided`` tells the session that formed
        the id why)."""
        reader = self._reader(session)
        status = self._status(invocation_id)
        return status if status is not None and may_read(reader, status.get("tenant")) else None

    def status_or_undecided(self, invocation_id: str, session: str) -> dict[str, Any] | None:
        """``status``; for an id bound to this very session (``is_bound``: only its holder
        formed it) of which nothing is recorded yet, ``pending_decision``: the call was
        published and is not decided, or its publishing failed (then the caller was answered
        ``broker_unavailable``). Never ``allowed`` for a call no policy decided."""
        reader = self._reader(session)
        status = self._status(invocation_id)  # one read of the view
        if status is None:
            return undecided(invocation_id) if is_bound(invocation_id, session) else None
        return status if may_read(reader, status.get("tenant")) else None

    def status_for(self, invocation_id: str, reader: Principal) -> dict[str, Any] | None:
        """An invocation's status for a verified ``reader`` of its tenant (an AuthZEN PEP,
        ADR 0090); None when there is none or it is another tenant's."""
        status = self._status(invocation_id)
        return status if status is not None and may_read(reader, status.get("tenant")) else None

    def audit(self, invocation_id: str | None = None, *, session: str) -> list[dict[str, Any]]:
        """Audit records of the session's tenant (every tenant for an operator)."""
        reader = self._reader(session)
        rows = [v for _, v in self.backend.view_items("audit") if may_read(reader, tenant_of(v))]
        if invocation_id is not None:
            rows = [r for r in rows if r.get("invocation_id") == invocation_id]
        return sorted(rows, key=lambda r: (r.get("partition_key", ""), r.get("seq", 0)))

    def audit_for(self, invocation_id: str, reader: Principal) -> list[dict[str, Any]]:
        """The audit records of one invocation for a verified ``reader`` of its tenant."""
        rows = [
            v
            for _, v in self.backend.view_items("audit")
            if v.get("invocation_id") == invocation_id and may_read(reader, tenant_of(v))
        ]
        return sorted(rows, key=lambda r: r.get("seq", 0))

    def audit_chains(self, session: str) -> list[dict[str, Any]]:
        """Every audit record of every chain, for an export: an operator's read only.

        A chain is exported whole or not at all (a gap would stop the export there), and a
        tenant's chain may hold a record no verified session owns, so a session without
        ``OPERATOR_ROLE`` is refused (``operator_required``) rather than given a partial one.
        """
        self._operator(session, "audit export")
        return [value for _, value in self.backend.view_items("audit")]

    def verify_audit(self, tenant: str | None = None) -> VerifyResult:
        """Check every per-partition hash chain against its head (detects a cut-off tail).

        With ``tenant``, only the chains holding that tenant's records (a partition key
        hashes the tenant, so those chains hold no other tenant's records).
        """
        from callgate_projections.audit import verify_chain

        heads = [value for _, value in self.backend.view_items("audit_head")]
        records = sorted(
            (value for _, value in self.backend.view_items("audit")),
            key=lambda r: (r.get("partition_key", ""), r.get("seq", 0)),
        )
        if tenant is not None:
            mine = {r.get("partition_key") for r in records if tenant_of(r) == tenant}
            records = [r for r in records if r.get("partition_key") in mine]
            heads = [h for h in heads if h.get("partition_key") in mine]
        return verify_chain(records, heads=heads)

    def effects(self) -> list[dict[str, Any]]:
        return list(self.app.ledger.effects())

    def usage(
        self,
        session: str,
        limit: str | None = None,
        *,
        actor: str | None = None,
        tool: str | None = None,
    ) -> list[dict[str, Any]]:
        """Each limit's usage per scope (ADR 0079) of the session's tenant (every tenant for
        an operator), ``used`` counted now, ``limit`` only that one; busiest first.

        ``actor`` and ``tool``: only the scopes a call of ``tool`` by ``actor`` would count
        in (the limits of the profile that cover ``tool``, their scopes of that actor or
        of no actor, of that tool or of no tool), what an approver weighs beside it."""
        from callgate.domain.usage import used_now

        reader, now = self._reader(session), self.app.clock()
        covering = None if tool is None else {u.name for u in self.app.profile.limits_of(tool)}
        rows: list[dict[str, Any]] = []
        for key, v in self.backend.view_items("usage"):
            if not may_read(reader, v["scope"]["tenant"]) or limit not in (None, v["limit"]):
                continue
            if covering is not None and (
                v["limit"] not in covering or v["scope"]["tool"] not in (None, tool)
            ):
                continue
            if actor is not None and v["scope"]["actor"] not in (None, actor):
                continue
            scope = {k: x for k, x in v["scope"].items() if x is not None}
            rows.append(
                {"key": key, "limit": v["limit"], "scope": scope, "used": used_now(v, now),
                 "max": v["max"], "held": v["held"], "window_ms": v["window_ms"],
                 "raised": v["raised"], "changes": v["changes"]}
            )  # fmt: skip
        return sorted(rows, key=lambda r: (-r["used"] / max(1, r["max"]), r["limit"], r["key"]))


def tenant_of(record: Mapping[str, Any]) -> object:
    """The tenant an audit record belongs to (its verified principal's), or None."""
    principal = (record.get("authorized_by") or {}).get("principal") or {}
    return principal.get("tenant") if isinstance(principal, Mapping) else None
