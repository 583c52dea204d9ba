"""Deciding the recorded history again under a candidate profile (``callgate policy simulate``).

Every ``PolicyDecided`` on the log records what the decision was made on: the verified
principal, the tool, the normalized arguments, the target and the facts about its owner
(``resource_json``). A candidate profile decides the same inputs with the same pure steps
the decider uses (schema, identity arguments, Cedar, the confirmation a call needs), so
the only difference between a recorded gate and a simulated one is the profile. Nothing
is published and no provider is asked: facts the provider gave are taken as recorded.

A decision is reduced to its *gate*, what happens to the call next:

- ``tool_forbidden``, ``unknown_tool``, ``invalid_arguments``, ``identity_spoof``: refused;
- ``limit_exceeded``: refused by the candidate's usage limits, replayed in log order
  (``callgate.domain.simulated_usage``);
- ``approval_required``: the call waits for a confirmation (owner or approver);
- ``executed``: the call goes on to run.

A change is a recorded decision whose gate under the candidate differs from its gate as
recorded; its transition reads ``<recorded outcome> → <candidate gate>``, the recorded
outcome being the invocation's final one (the ``status`` view), so ``executed →
tool_forbidden`` is a call that ran and that the candidate would have refused.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from callgate.domain.arguments import normalize_args, target_of
from callgate.domain.catalog import Confirmation, Profile, ToolSpec
from callgate.domain.codes import Code, Rejection
from callgate.domain.events import PolicyDecided
from callgate.domain.identity_args import check_identity
from callgate.domain.policy import PolicyEngine, ResourceFacts
from callgate.domain.principal import Principal

EXECUTED = Code.EXECUTED.value
APPROVAL_REQUIRED = Code.APPROVAL_REQUIRED.value
TOOL_FORBIDDEN = Code.TOOL_FORBIDDEN.value
# Examples kept per transition: enough to look at, bounded however long the history.
EXAMPLES_PER_TRANSITION = 5


def recorded_gate(decided: PolicyDecided) -> str:
    """The gate of a decision as it was made."""
    if decided.decision != "permit":
        return TOOL_FORBIDDEN
    return EXECUTED if decided.confirmation == Confirmation.NONE.value else APPROVAL_REQUIRED


@dataclass(frozen=True, slots=True)
class Checked:
    """A recorded call's inputs as the candidate checked them, for its policy."""

    spec: ToolSpec
    principal: Principal
    args: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Change:
    """One recorded decision the candidate decides otherwise."""

    invocation_id: str
    tool: str
    tenant: str
    actor: str
    recorded: str  # the invocation's final outcome as recorded
    candidate: str  # the gate under the candidate
    reason: str  # why the candidate decides so (a refusal's message, the policies)

    @property
    def transition(self) -> str:
        return f"{self.recorded} → {self.candidate}"


@dataclass(frozen=True, slots=True)
class LimitRefusal:
    """A recorded call the candidate's limits would have refused, and the usage then:
    ``details`` as ``limit_exceeded`` names them (limit, window, used, max, amount,
    retry_after_s)."""

    invocation_id: str
    tool: str
    tenant: str
    actor: str
    occurred_at: int
    details: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "invocation_id": self.invocation_id,
            "tool": self.tool,
            "tenant": self.tenant,
            "actor": self.actor,
            "occurred_at": self.occurred_at,
            **self.details,
        }


@dataclass(slots=True)
class SimulationReport:
    """What changes under the candidate: counts, per tool and transition, and examples;
    every call its limits would have refused, in log order."""

    candidate_version: str
    decided: int = 0  # recorded decisions decided again
    changed: int = 0
    by_transition: Counter[str] = field(default_factory=Counter)
    by_tool: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[Change]] = field(default_factory=dict)
    limit_refusals: list[LimitRefusal] = field(default_factory=list)

    def add(self, change: Change) -> None:
        self.changed += 1
        self.by_transition[change.transition] += 1
        self.by_tool[change.tool] += 1
        kept = self.examples.setdefault(change.transition, [])
        if len(kept) < EXAMPLES_PER_TRANSITION:
            kept.append(change)

    def merge(self, other: SimulationReport) -> None:
        """Fold a report of another part of the history into this one."""
        self.decided += other.decided
        self.changed += other.changed
        self.by_transition.update(other.by_transition)
        self.by_tool.update(other.by_tool)
        for transition, changes in other.examples.items():
            kept = self.examples.setdefault(transition, [])
            kept.extend(changes[: EXAMPLES_PER_TRANSITION - len(kept)])
        self.limit_refusals.extend(other.limit_refusals)

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate_version": self.candidate_version,
            "decided": self.decided,
            "changed": self.changed,
            "by_transition": dict(sorted(self.by_transition.items())),
            "by_tool": dict(sorted(self.by_tool.items())),
            "examples": [
                {
                    "invocation_id": c.invocation_id,
                    "tool": c.tool,
                    "tenant": c.tenant,
                    "actor": c.actor,
                    "transition": c.transition,
                    "reason": c.reason,
                }
                for transition in sorted(self.examples)
                for c in self.examples[transition]
            ],
            "limit_refusals": [r.to_json() for r in self.limit_refusals],
        }


class Simulator:
    """Decides recorded ``PolicyDecided`` inputs under one candidate profile.

    ``known``: profiles by version (digest) whose checks are known to have passed for the
    decisions recorded under them (the live profile). Where the candidate checks a tool's
    arguments exactly as such a profile did (same schema, limits, identity arguments and
    tenant fields), the recorded arguments, which are the output of those checks, are
    taken as they are instead of being checked again: same checks, same verdict.
    """

    def __init__(self, candidate: Profile, known: Mapping[str, Profile] | None = None) -> None:
        self.profile = candidate
        self.engine = PolicyEngine(candidate)
        self._known = dict(known or {})
        self._same: dict[tuple[str, str], bool] = {}

    def _checks_unchanged(self, version: str, spec: ToolSpec) -> bool:
        found = self._same.get((version, spec.name))
        if found is None:
            known = self._known.get(version)
            old = None if known is None else known.tool(spec.name)
            found = self._same[(version, spec.name)] = (
                known is not None
                and old is not None
                and old.args_schema_key == spec.args_schema_key
                and old.identity_args == spec.identity_args
                and known.entry_limits == self.profile.entry_limits
                and known.tenant_fields == self.profile.tenant_fields
            )
        return found

    def gate(self, decided: PolicyDecided) -> tuple[str, str]:
        """The candidate's gate for the recorded inputs, and why."""
        checked = self.checked(decided)
        return checked if isinstance(checked, tuple) else self.decide(decided, checked)

    def checked(self, decided: PolicyDecided) -> Checked | tuple[str, str]:
        """The candidate's checks before its policy (catalog, schema, identity): what the
        policy decides on, or the refusal's gate and why."""
        spec = self.profile.tool(decided.tool)
        if spec is None:
            return Code.UNKNOWN_TOOL.value, f"no tool named {decided.tool!r} in the candidate"
        principal = Principal(
            decided.actor,
            decided.tenant,
            tuple(decided.roles),
            agent=decided.agent,
            delegation=tuple(decided.delegation),
        )
        if self._checks_unchanged(decided.policy_version, spec):
            args = orjson.loads(decided.args_json)
        else:
            try:
                args = normalize_args(spec, self.profile.entry_limits, decided.args_json)
                args = check_identity(
                    spec.identity_args, self.profile.tenant_fields, args, principal
                )
            except Rejection as refused:
                return refused.code.value, refused.message
        return Checked(spec, principal, args)

    def decide(
        self,
        decided: PolicyDecided,
        checked: Checked,
        usage: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> tuple[str, str]:
        """The candidate policy's gate on checked inputs (``usage``: ``context.usage``)."""
        spec, args = checked.spec, checked.args
        target = target_of(spec, args)
        facts = _facts(decided.resource_json)
        if facts is None and spec.target_arg is not None and target:
            owner = self.profile.owner_of(target)
            facts = ResourceFacts("profile", owner, {}) if owner is not None else None
        decision = self.engine.decide(checked.principal, spec, target, args, facts, usage=usage)
        why = ", ".join(decision.determining_policies or decision.errors) or "no permit matched"
        if not decision.allowed:
            return TOOL_FORBIDDEN, why
        if spec.confirmation_for(args) is Confirmation.NONE:
            return EXECUTED, why
        return APPROVAL_REQUIRED, why

    def differing(
        self,
        decisions: Iterable[PolicyDecided],
        *,
        tenant: str | None = None,
        since_ms: int | None = None,
    ) -> tuple[int, list[Change]]:
        """Decide every recorded decision again (of ``tenant``, from ``since_ms``): how many
        were decided, and the changes, each with its recorded gate as ``recorded``."""
        decided_count = 0
        found: list[Change] = []
        for decided in decisions:
            if tenant is not None and decided.tenant != tenant:
                continue
            if since_ms is not None and decided.occurred_at < since_ms:
                continue
            decided_count += 1
            candidate, why = self.gate(decided)
            was = recorded_gate(decided)
            if candidate != was:
                found.append(
                    Change(
                        decided.invocation_id,
                        decided.tool,
                        decided.tenant,
                        decided.actor,
                        was,
                        candidate,
                        why,
                    )
                )
        return decided_count, found

    def report(
        self,
        decided: int,
        found: Iterable[Change],
        outcome_of: Callable[[str], str | None],
        limit_refusals: Iterable[LimitRefusal] = (),
    ) -> SimulationReport:
        """The report of ``differing``'s result; ``outcome_of``: an invocation's final
        outcome as recorded (asked of changes only), which replaces the recorded gate."""
        report = SimulationReport(
            self.profile.digest, decided=decided, limit_refusals=list(limit_refusals)
        )
        for change in found:
            outcome = outcome_of(change.invocation_id)
            report.add(dataclasses.replace(change, recorded=outcome or change.recorded))
        return report


def _facts(resource_json: str | None) -> ResourceFacts | None:
    """The owner facts the decision was made on (None: the profile's, or a new resource)."""
    if resource_json is None:
        return None
    body = orjson.loads(resource_json)
    return ResourceFacts(
        source=str(body.get("source", "")),
        tenant=body.get("tenant"),
        attributes=body.get("attributes") or {},
        message=str(body.get("message", "")),
    )
