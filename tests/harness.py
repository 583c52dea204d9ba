"""A test gate: the real decider, executor, projections and simulated providers.

Runs on the in-memory runner so decider-level tests are fast and deterministic;
the same processes run on the embedded and Kafka runners in integration tests.
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, overload

import jwt
import yaml

from callgate.adapters.memory import Chaos, MemoryRunner
from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.approvals import peek_partition_key
from callgate.domain.canonical import partition_key
from callgate.domain.catalog import default_profile_path
from callgate.domain.scope import bound_id
from callgate.executor.invocations import Invocations
from callgate.providers.base import (
    Describes,
    DryRunResult,
    ExecutionResult,
    Lookup,
    Provider,
    ProviderError,
    ResourceDescription,
)
from callgate.providers.registry import ProviderRegistry

T0 = 1_800_000_000_000
E = TypeVar("E", bound=ev.Event)
DAY_S = 86_400


class Gate:
    def __init__(
        self,
        state_dir: Path,
        faults: dict[str, Any] | None = None,
        profile: Path | None = None,
        chaos: Chaos | None = None,
        runner: MemoryRunner | None = None,
        continuation: bool = False,
        **settings: Any,
    ) -> None:
        """``settings``: more ``Settings`` fields (``approvals``, ``sessions``, ``dev``...);
        development mode is on unless ``dev=False`` is given.

        ``continuation``: with the default profile, whether a granted approval continues
        its invocation (ADR 0029, the shipped default). Off, the agent resubmits with the
        ``approval_id``, which the resubmission rules (C4, C8, C11, V2) are tested on.
        """
        if profile is None and not continuation:
            profile = write_profile(state_dir / "resubmit-profile")
        self.settings = Settings(
            **{"dev": True, **settings},
            state_dir=state_dir,
            faults=faults or {},
            profile=profile,
        )
        self.runner = runner or MemoryRunner([], now_ms=T0, chaos=chaos)
        self.app: App = bootstrap(self.settings, clock=lambda: self.runner.now_ms)
        self.runner.processes = self.app.processes()
        self._ids = itertools.count(1)
        self.calls: list[tuple[str, str]] = []  # (method, token or tool) when recording

    def redeploy(self, profile: Path | None = None, **settings: Any) -> Gate:
        """The same deployment (keys, ledger, log and state) restarted with another profile
        and/or other ``Settings`` fields (a new configuration)."""
        kept = self.settings.model_dump(include={"dev", "sessions", "approvals"})
        gate = Gate(
            self.settings.state_dir,
            dict(self.settings.faults),
            profile or self.settings.profile,
            runner=self.runner,
            **{**kept, **settings},
        )
        gate._ids = self._ids
        self.runner.restart(gate.app.processes())
        return gate

    # -- identities -----------------------------------------------------------------
    def session(
        self,
        user: str,
        tenant: str = "acme",
        roles: tuple[str, ...] = ("support",),
        ttl: int = 3600,
    ) -> str:
        return self.app.session_issuer.issue(
            user, tenant, list(roles), self.runner.now_ms, ttl_seconds=ttl
        )

    # -- requests -------------------------------------------------------------------
    def proposal(
        self,
        token: str,
        tool: str,
        args: Mapping[str, Any] | str,
        key: str | None = None,
        approval_id: str | None = None,
        tenant: str | None = None,
        invocation_id: str | None = None,
    ) -> ev.ToolCallProposed:
        # Bound to the session as the SDK binds it (domain/scope.py), unless a test names one.
        inv = invocation_id or bound_id(token, f"inv-{next(self._ids)}")
        if key is not None:
            pk = partition_key(tenant or token_tenant(token), key, inv)
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

    def propose(self, token: str, tool: str, args: Mapping[str, Any] | str, **kw: Any) -> str:
        p = self.proposal(token, tool, args, **kw)
        self.runner.publish(p)
        self.runner.run()
        return p.invocation_id

    def decision(
        self, token: str, invocation_id: str, decision: str = "grant", reason: str = ""
    ) -> ev.ApprovalDecisionSubmitted:
        """An approval decision routed to the invocation's partition (not yet published)."""
        known = self.events_of(invocation_id)
        pk = known[0].partition_key if known else ""
        return ev.ApprovalDecisionSubmitted(
            event_id=bound_id(token, f"dec-{next(self._ids)}"),
            invocation_id=invocation_id,
            partition_key=pk,
            occurred_at=self.runner.now_ms,
            producer="test-ui",
            session_token=token,
            decision=decision,
            reason=reason,
        )

    def decide(
        self, token: str, invocation_id: str, decision: str = "grant", reason: str = ""
    ) -> str:
        d = self.decision(token, invocation_id, decision, reason)
        self.runner.publish(d)
        self.runner.run()
        return d.event_id

    def approve(self, token: str, invocation_id: str) -> str:
        """Grant the pending approval of ``invocation_id``; return the ``approval_id``."""
        self.decide(token, invocation_id)
        return self.approval_id(invocation_id)

    # -- reading --------------------------------------------------------------------
    def status(self, invocation_id: str) -> dict[str, Any]:
        raw = self.runner.log.views.get("status", {}).get(invocation_id)
        assert raw is not None, f"no status for {invocation_id}"
        value: dict[str, Any] = json.loads(raw)
        return value

    def outcome(self, invocation_id: str) -> str:
        return str(self.status(invocation_id)["outcome"])

    def error_details(self, invocation_id: str) -> dict[str, Any]:
        error = self.status(invocation_id)["error"]
        assert error is not None, f"{invocation_id} has no error"
        details: dict[str, Any] = error["details"]
        return details

    def approval_id(self, invocation_id: str) -> str:
        granted = self.events_of(invocation_id, ev.ApprovalGranted)
        assert granted, f"no approval granted for {invocation_id}"
        return granted[-1].approval_id

    @overload
    def events_of(self, invocation_id: str) -> list[ev.Event]: ...
    @overload
    def events_of(self, invocation_id: str, cls: type[E]) -> list[E]: ...
    def events_of(self, invocation_id: str, cls: type[ev.Event] = ev.Event) -> list[Any]:
        """Events of one invocation of type ``cls``, once per ``event_id``."""
        return [e for e in self.events(cls) if e.invocation_id == invocation_id]

    @overload
    def events(self) -> list[ev.Event]: ...
    @overload
    def events(self, cls: type[E]) -> list[E]: ...
    def events(self, cls: type[ev.Event] = ev.Event) -> list[Any]:
        """Every event on the log of type ``cls``, once per ``event_id`` (duplicates dropped)."""
        seen: set[str] = set()
        out: list[ev.Event] = []
        for e in self.runner.log.events:
            if isinstance(e, cls) and e.event_id not in seen:
                seen.add(e.event_id)
                out.append(e)
        return out

    def pending(self) -> dict[str, dict[str, Any]]:
        return {k: json.loads(v) for k, v in self.runner.log.views.get("pending", {}).items()}

    def audit(self, invocation_id: str) -> list[dict[str, Any]]:
        """The audit records of ``invocation_id``, oldest revision first (C9)."""
        records = [json.loads(v) for v in self.runner.log.views.get("audit", {}).values()]
        mine = [r for r in records if r["invocation_id"] == invocation_id]
        return sorted(mine, key=lambda r: int(r["revision"]))

    def effects(self) -> list[dict[str, Any]]:
        return list(self.app.ledger.effects())

    # -- fault and call recording -----------------------------------------------------
    def record_provider_calls(self) -> None:
        """Record every provider call (method, token or tool) in ``self.calls``."""
        pair = next(p for p in self.runner.processes if isinstance(p, Invocations))
        executor = pair.executor
        executor.providers = ProviderRegistry(
            _Recording(p, self.calls.append) for p in executor.providers
        )


class _Recording:
    """A provider that notes each call, then delegates to the real one."""

    def __init__(self, inner: Provider, note: Callable[[tuple[str, str]], None]) -> None:
        self.name = inner.name
        self._inner, self._note = inner, note

    def dry_run(self, tool: str, target: str, args: Mapping[str, Any], tenant: str) -> DryRunResult:
        self._note(("dry_run", tool))
        return self._inner.dry_run(tool, target, args, tenant)

    def execute(
        self,
        tool: str,
        target: str,
        args: Mapping[str, Any],
        tenant: str,
        token: str,
        invocation_id: str,
    ) -> ExecutionResult:
        self._note(("execute", token))
        return self._inner.execute(tool, target, args, tenant, token, invocation_id)

    def lookup(self, token: str, tool: str = "") -> Lookup:
        self._note(("lookup", token))
        return self._inner.lookup(token, tool)

    def describe(self, tool: str, target: str) -> ResourceDescription:
        self._note(("describe", target))
        if not isinstance(self._inner, Describes):
            raise ProviderError(f"provider {self.name!r} does not describe its resources")
        return self._inner.describe(tool, target)


def token_tenant(token: str) -> str:
    claims = jwt.decode(token, options={"verify_signature": False})
    return str(claims["tenant"])


def without_continuation(profile: Path) -> Path:
    """``profile`` rewritten in place so that every tool waits for the agent's
    resubmission after an approval and one approver suffices (ADR 0029, 0030)."""
    raw = yaml.safe_load(profile.read_text())
    for body in raw["tools"].values():
        body["continue_on_approval"] = False
        body.pop("approvals_required", None)
        body.pop("approvals_required_when", None)
    profile.write_text(yaml.safe_dump(raw, sort_keys=False))
    return profile


def write_profile(
    directory: Path,
    edit_tools: Callable[[dict[str, Any]], None] | None = None,
    policy_suffix: str = "",
    continuation: bool = False,
) -> Path:
    """A copy of the default profile in ``directory``, changed by ``edit_tools`` (C10).

    Without ``continuation``, the approvals as the resubmission rules (C4, C8, C11, V2) are
    tested on: every tool waits for the agent's resubmission (ADR 0029:
    ``continue_on_approval: false``) and one approver suffices (no quorum, ADR 0030),
    unless ``edit_tools`` says otherwise.

    ``policy_suffix`` is appended to the Cedar text, which changes the policy version.
    """
    source = default_profile_path()
    directory.mkdir(parents=True, exist_ok=True)
    raw = yaml.safe_load(source.read_text())
    if not continuation:
        for body in raw["tools"].values():
            body["continue_on_approval"] = False
            body.pop("approvals_required", None)
            body.pop("approvals_required_when", None)
    if edit_tools is not None:
        edit_tools(raw["tools"])
    target = directory / "profile.yaml"
    target.write_text(yaml.safe_dump(raw, sort_keys=False))
    policy = source.parent / raw["policy_file"]
    shutil.copy(policy, directory / raw["policy_file"])
    if policy_suffix:
        with (directory / raw["policy_file"]).open("a") as f:
            f.write("\n" + policy_suffix + "\n")
    return target
