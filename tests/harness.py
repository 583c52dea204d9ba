"""A test gate: the real decider, executor, projections and simulated providers.

Runs on the in-memory runner so decider-level tests are fast and deterministic;
the same processes run on the embedded and Kafka runners in integration tests.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from callgate import events as ev
from callgate.adapters.memory import MemoryRunner
from callgate.approvals import peek_partition_key
from callgate.bootstrap import App, Settings, bootstrap
from callgate.canonical import partition_key

T0 = 1_800_000_000_000


class Gate:
    def __init__(self, state_dir: Path, faults: dict[str, Any] | None = None, profile: Path | None = None):
        self.settings = Settings(state_dir=state_dir, faults=faults or {}, profile=profile)
        self.runner = MemoryRunner([], now_ms=T0)
        self.app: App = bootstrap(self.settings, clock=lambda: self.runner.now_ms)
        self.runner.processes = self.app.processes()
        self._ids = itertools.count(1)

    # -- identities -----------------------------------------------------------------
    def session(
        self, user: str, tenant: str = "acme", roles: tuple[str, ...] = ("support",), ttl: int = 3600
    ) -> str:
        return self.app.session_issuer.issue(user, tenant, list(roles), self.runner.now_ms, ttl_seconds=ttl)

    # -- requests -------------------------------------------------------------------
    def proposal(
        self,
        token: str,
        tool: str,
        args: dict[str, Any] | str,
        key: str | None = None,
        approval_id: str | None = None,
        tenant: str | None = None,
        invocation_id: str | None = None,
    ) -> ev.ToolCallProposed:
        inv = invocation_id or f"inv-{next(self._ids)}"
        if key is not None:
            pk = partition_key(tenant or _tenant(token), key, inv)
        elif approval_id is not None:
            pk = peek_partition_key(approval_id) or ""
        else:
            pk = partition_key("", None, inv)
        return ev.ToolCallProposed(
            event_id=f"evt-{inv}",
            invocation_id=inv,
            partition_key=pk,
            occurred_at=self.runner.now_ms,
            producer="test-agent",
            session_token=token,
            tool=tool,
            args_json=args if isinstance(args, str) else json.dumps(args),
            idempotency_key=key,
            approval_id=approval_id,
        )

    def propose(self, token: str, tool: str, args: dict[str, Any] | str, **kw: Any) -> str:
        p = self.proposal(token, tool, args, **kw)
        self.runner.publish(p)
        self.runner.run()
        return p.invocation_id

    def decide(self, token: str, invocation_id: str, decision: str = "grant", reason: str = "") -> str:
        pending = self.status(invocation_id)
        d = ev.ApprovalDecisionSubmitted(
            event_id=f"dec-{next(self._ids)}",
            invocation_id=invocation_id,
            partition_key=pending["partition_key"],
            occurred_at=self.runner.now_ms,
            producer="test-ui",
            session_token=token,
            decision=decision,
            reason=reason,
        )
        self.runner.publish(d)
        self.runner.run()
        return d.event_id

    # -- reading --------------------------------------------------------------------
    def status(self, invocation_id: str) -> dict[str, Any]:
        raw = self.runner.log.views.get("status", {}).get(invocation_id)
        assert raw is not None, f"no status for {invocation_id}"
        value: dict[str, Any] = json.loads(raw)
        return value

    def outcome(self, invocation_id: str) -> str:
        return str(self.status(invocation_id)["outcome"])

    def approval_id(self, invocation_id: str) -> str:
        granted = [e for e in self.runner.log.of(invocation_id) if isinstance(e, ev.ApprovalGranted)]
        assert granted, f"no approval granted for {invocation_id}"
        return granted[-1].approval_id

    def events_of(self, invocation_id: str, cls: type[ev.Event] = ev.Event) -> list[ev.Event]:
        return [e for e in self.runner.log.of(invocation_id) if isinstance(e, cls)]

    def pending(self) -> dict[str, dict[str, Any]]:
        return {k: json.loads(v) for k, v in self.runner.log.views.get("pending", {}).items()}

    def effects(self) -> list[dict[str, Any]]:
        return list(self.app.ledger.effects())


def _tenant(token: str) -> str:
    import jwt

    claims = jwt.decode(token, options={"verify_signature": False})
    return str(claims["tenant"])
