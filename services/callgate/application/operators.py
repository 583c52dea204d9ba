"""Operators' commands (``operator_required`` otherwise): policy versions, limits, freezes,
pins, simulation. Each is published as an event authored by the verified session."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from callgate.domain import events as ev
from callgate.domain.canonical import canonical_json
from callgate.domain.codes import Code, Rejection
from callgate.domain.limits import check_text_field
from callgate.domain.principal import Principal
from callgate.domain.scope import OPERATOR_ROLE

if TYPE_CHECKING:
    from callgate.domain.catalog import Profile
    from callgate.domain.pins import Pins
    from callgate.domain.policy_versions import PolicyVersions
    from callgate.domain.simulation import SimulationReport


from callgate.application.base import UseCases


class OperatorCommands(UseCases):
    """Operators' commands: policy versions, limits, freezes, pins, simulation."""

    def simulate(
        self,
        candidate: Profile,
        *,
        session: str,
        tenant: str | None = None,
        since_ms: int | None = None,
        workers: int | None = None,
    ) -> SimulationReport:
        """Every recorded decision decided again under ``candidate``: what would change,
        and the calls its limits would have refused.

        An operator's read of every tenant's history (``operator_required`` otherwise);
        nothing is published and no provider is called (``callgate.domain.simulation``).
        A candidate with limits reads what ended each call too, and takes the calls in the
        order of their times: the log orders them per partition only (Kafka), and a
        limit's scope spans partitions.
        """
        from callgate.domain.simulation import Simulator

        reader = self._reader(session)
        if not reader.has_any_role((OPERATOR_ROLE,)):
            raise Rejection(
                Code.OPERATOR_REQUIRED, f"policy simulate needs the {OPERATOR_ROLE} role"
            )
        from callgate.application.simulate import simulate
        from callgate.domain.simulated_usage import HISTORY_EVENTS

        live = self.app.profile
        simulator = Simulator(candidate, known={live.digest: live})
        history = list(
            self.backend.read_events(only=HISTORY_EVENTS if candidate.limits else ev.PolicyDecided)
        )
        if candidate.limits:
            history.sort(key=lambda e: e.occurred_at)  # stable: the log's order at equal times
        return simulate(
            simulator,
            history,
            lambda invocation_id: (self._status(invocation_id) or {}).get("outcome"),
            tenant=tenant,
            since_ms=since_ms,
            workers=workers,
        )

    def change_limit(
        self, limit: str, scope: Mapping[str, str], *, action: str, reason: str, session: str,
        raise_by: int = 0,
    ) -> ev.UsageLimitChanged:  # fmt: skip
        """An operator's ``limits reset`` or ``raise`` of one limit in one scope (ADR 0079):
        published as an event with author and reason, folded by the usage process (which
        answers every later reservation with it) and the usage view."""
        operator = self._operator(session, f"limits {action}")
        check_text_field("reason", reason)
        found = next((u for u in self.app.profile.limits if u.name == limit), None)
        if found is None:
            raise Rejection(Code.INVALID_REQUEST, f"no limit named {limit!r} in the profile")
        if action not in ("reset", "raise") or (action == "raise") != (raise_by > 0):
            raise Rejection(Code.INVALID_REQUEST, "reset, or raise by a positive amount")
        needed = {"tenant", *found.per}
        if set(scope) != needed or not all(scope.values()):
            raise Rejection(
                Code.INVALID_REQUEST,
                f"limit {limit} counts per {', '.join(sorted(needed))}: give exactly those",
            )
        values = {k: scope.get(k, "") for k in ("tenant", "actor", "agent", "tool")}
        key = found.scope_key(values["tenant"], values["actor"], values["agent"], values["tool"])
        event = ev.UsageLimitChanged(
            event_id=str(uuid.uuid4()),
            invocation_id=f"limits-{key}",
            partition_key=key,
            occurred_at=self.app.clock(),
            producer="callgate-sdk",
            limit=limit,
            scope_json=canonical_json(
                found.scope_of(values["tenant"], values["actor"], values["agent"], values["tool"])
            ),
            action=action,
            raise_by=raise_by,
            reason=reason,
            author=operator.user,
            tenant=operator.tenant,
        )
        self.backend.publish([event])
        return event

    def policy_versions(self) -> PolicyVersions:
        """The policy-version events of the log, folded in log order."""
        from callgate.domain.policy_versions import POLICY_EVENTS, fold

        return fold([e for e in self.backend.read_events() if isinstance(e, POLICY_EVENTS)])

    def _policy_event(
        self, cls: Callable[..., ev.Event], operator: Principal, version: str, reason: str,
        **fields: str,
    ) -> ev.Event:  # fmt: skip
        check_text_field("reason", reason)
        event = cls(
            event_id=str(uuid.uuid4()),
            invocation_id=f"policy-{version or 'off'}",
            partition_key=ev.POLICY_KEY,
            occurred_at=self.app.clock(),
            producer="callgate-sdk",
            version=version,
            author=operator.user,
            tenant=operator.tenant,
            reason=reason,
            **fields,
        )
        self.backend.publish([event])
        return event

    def publish_policy(
        self, profile_yaml: str, policy_text: str, *, reason: str, session: str
    ) -> str:
        """Publish a catalog+policy version (an operator's); its version, the digest.
        ``policy_version_invalid`` when it does not parse: nothing is published."""
        from callgate.domain.policy_versions import content_of

        operator = self._operator(session, "policy publish")
        check_text_field("profile and policy", profile_yaml + policy_text)  # one record
        profile = content_of(profile_yaml, policy_text)
        if profile.digest not in self.policy_versions().published:
            self._policy_event(
                ev.PolicyPublished, operator, profile.digest, reason,
                profile_yaml=profile_yaml, policy_text=policy_text,
            )  # fmt: skip
        return profile.digest

    def activate_policy(self, version: str, *, reason: str, session: str) -> ev.Event:
        """Make a published version the active one on every decider, from this event's
        position in the log on (rolling back: an earlier version)."""
        operator = self._operator(session, "policy activate")
        self.policy_versions().require_published(version)
        return self._policy_event(ev.PolicyActivated, operator, version, reason)

    def shadow_policy(self, version: str | None, *, reason: str, session: str) -> ev.Event:
        """Decide every live call under ``version`` too (``None``: stop), never changing an
        outcome: a different decision is a ``ShadowDecisionDiffered``."""
        operator = self._operator(session, "policy shadow")
        if version is not None:
            self.policy_versions().require_published(version)
        return self._policy_event(ev.PolicyShadowSet, operator, version or "", reason)

    def policy_history(self, *, session: str) -> dict[str, Any]:
        """Every publish, activation and shadow change with who, when and why."""
        self._operator(session, "policy history")
        versions = self.policy_versions()
        return {
            "active": versions.active or None,
            "shadow": versions.shadow or None,
            "history": [entry.to_json() for entry in versions.history],
        }

    def shadow_report(self, *, session: str, version: str | None = None) -> dict[str, Any]:
        """The recorded disagreements of a shadow version (every one: ``version`` None)."""
        self._operator(session, "policy shadow report")
        found = [
            e for e in self.backend.read_events(only=ev.ShadowDecisionDiffered)
            if isinstance(e, ev.ShadowDecisionDiffered)
            and (version is None or e.candidate_version == version)
        ]  # fmt: skip
        counts: dict[str, int] = {}
        for e in found:
            transition = f"{e.active_outcome} → {e.candidate_outcome}"
            counts[transition] = counts.get(transition, 0) + 1
        return {
            "differed": len(found),
            "by_transition": dict(sorted(counts.items())),
            "differences": [
                {
                    "invocation_id": e.invocation_id,
                    "tool": e.tool,
                    "actor": e.actor,
                    "tenant": e.call_tenant,
                    "active_version": e.active_version,
                    "active_outcome": e.active_outcome,
                    "candidate_version": e.candidate_version,
                    "candidate_outcome": e.candidate_outcome,
                    "reason": e.reason,
                    "at": e.occurred_at,
                }
                for e in found
            ],
        }

    def freeze(
        self, scope: str, value: str, *, reason: str, session: str, lift: bool = False
    ) -> ev.FreezeApplied | ev.FreezeLifted:
        """Freeze (``lift``: unfreeze) every call of one tool, tenant or actor on every
        instance (ADR 0054): an operator's command (``operator_required`` otherwise), its
        fields checked before anything is published (``invalid_request``). The event is
        authored by the verified session; the deciders fold it and refuse ``frozen``."""
        from callgate.domain.freeze import FREEZE_KEY, checked_request

        operator = self._operator(session, "unfreeze" if lift else "freeze")
        checked_request(scope, value, reason, lifting=lift)
        kind: type[ev.FreezeApplied] | type[ev.FreezeLifted] = (
            ev.FreezeLifted if lift else ev.FreezeApplied
        )
        event_id = uuid.uuid4().hex
        event = kind(
            event_id=event_id,
            invocation_id=f"{FREEZE_KEY}-{event_id}",
            partition_key=FREEZE_KEY,
            correlation_id=event_id,
            occurred_at=self.app.clock(),
            producer="callgate-sdk",
            scope=scope,
            value=value,
            reason=reason,
            author=operator.user,
            tenant=operator.tenant,
        )
        self.backend.publish([event])
        return event

    def pins(self) -> Pins:
        """The pins and the definitions last seen, folded from the log (ADR 0066)."""
        from callgate.application import pinning
        from callgate.domain.pins import PIN_EVENTS

        return pinning.fold(e for cls in PIN_EVENTS for e in self.backend.read_events(only=cls))

    def pin_tools(self, *, session: str, reason: str, tool: str | None = None) -> list[ev.Event]:
        """Pin every catalog tool of an MCP upstream (``tool``: that one) to the definition
        its upstream serves now: a ``ToolPinned`` each (an operator's command,
        ``operator_required`` otherwise). A tool that is not one, or whose upstream cannot
        be listed or no longer lists it, is refused and nothing is written."""
        from callgate.application import pinning
        from callgate.domain.freeze import checked_request

        operator = self._operator(session, "catalog pin")
        checked_request("tool", tool or "all", reason, lifting=False)
        now = pinning.served(self.app.providers, only=tool)
        if tool is not None and tool not in now:
            raise Rejection(Code.UNKNOWN_TOOL, f"{tool} is not a tool of a reachable MCP upstream")
        if absent := sorted(t for t, d in now.items() if d == pinning.ABSENT):
            raise Rejection(Code.UNKNOWN_TOOL, f"the upstream no longer lists {absent}")
        at = self.app.clock()
        events = [
            pinning.pin_event(ev.ToolPinned, at, tool=t, digest=d, reason=reason,
                              author=operator.user, tenant=operator.tenant)
            for t, d in sorted(now.items())
        ]  # fmt: skip
        self.backend.publish(events)
        return events

    def record_definitions(self) -> list[ev.Event]:
        """The pinning watcher's check: a ``ToolDefinitionChanged`` for each pinned tool
        whose upstream now serves another definition than last recorded (ADR 0066)."""
        from callgate.application import pinning

        now = pinning.served(self.app.providers)
        if not now:  # no pinnable tool reachable: the log is not read
            return []
        found = pinning.changes(self.app.profile, self.pins(), now, self.app.clock())
        if found:
            self.backend.publish(found)
        return found
