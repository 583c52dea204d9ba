"""Every callgate event, explicit and greppable (one Avro record per class, same name).

All events share one envelope (``Event``, in ``envelope``). Payload fields use only
Avro-friendly types: str, int, bool, optional str, tuple[str, ...]. JSON payloads
(arguments, results, dry-run snapshots) travel as canonical JSON strings so that hashes over
them are stable.

Topics (see README "Topics"):
- ``requests``: written by clients (agent platforms, approval UIs):
  ``ToolCallProposed``, ``ApprovalDecisionSubmitted`` (``requests``). They carry the bearer
  session token, so ``requests`` has a bounded retention (``requests_retention_ms``); what
  the decider records on ``events`` is the verified principal and ``session_digest``, never
  the token (ADR 0016).
- ``events``: the authoritative invocation log, written only by callgate services; one
  module per family (``decisions``, ``approvals``, ``executions``, ``policy_versions``,
  ``freezes``, ``pins``, ``usage``).
- ``dead-letter``: ``EventDeadLettered`` (``dead_letters``).

This package's top level names every event, and is the import path for all of them
(``from callgate.domain import events as ev``): the families are where each is defined,
the registry below is where each is known by name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from callgate.domain.events.approvals import (
    ApprovalDecisionRejected,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalGranted,
    ApprovalGrantRecorded,
    ApprovalRequested,
)
from callgate.domain.events.dead_letters import EventDeadLettered
from callgate.domain.events.decisions import (
    ConfirmationAccepted,
    DryRunRequested,
    PolicyDecided,
    ProposalRejected,
    ResourceDescribed,
    ResourceDescriptionRequested,
)
from callgate.domain.events.envelope import SCHEMA_VERSION, Event
from callgate.domain.events.executions import (
    DryRunFailed,
    DryRunRecorded,
    ExecutionFailed,
    ExecutionReconciled,
    ExecutionRequested,
    ExecutionStarted,
    ExecutionSucceeded,
    ExecutionUncertain,
    ReconciliationRequested,
    ReplayAwaited,
    ReplayServed,
)
from callgate.domain.events.freezes import FreezeApplied, FreezeLifted
from callgate.domain.events.pins import ToolDefinitionChanged, ToolPinned
from callgate.domain.events.policy_versions import (
    POLICY_KEY,
    PolicyActivated,
    PolicyPublished,
    PolicyShadowSet,
    ShadowDecisionDiffered,
)
from callgate.domain.events.requests import WITHDRAW, ApprovalDecisionSubmitted, ToolCallProposed
from callgate.domain.events.usage import (
    UsageCommitted,
    UsageLimitChanged,
    UsageRefused,
    UsageReleased,
    UsageReserved,
    UsageReserveRequested,
)

__all__ = [
    "BY_NAME",
    "EVENT_TYPES",
    "POLICY_KEY",
    "REQUEST_TYPES",
    "SCHEMA_VERSION",
    "WITHDRAW",
    "ApprovalDecisionRejected",
    "ApprovalDecisionSubmitted",
    "ApprovalDenied",
    "ApprovalExpired",
    "ApprovalGrantRecorded",
    "ApprovalGranted",
    "ApprovalRequested",
    "ConfirmationAccepted",
    "DryRunFailed",
    "DryRunRecorded",
    "DryRunRequested",
    "Event",
    "EventDeadLettered",
    "ExecutionFailed",
    "ExecutionReconciled",
    "ExecutionRequested",
    "ExecutionStarted",
    "ExecutionSucceeded",
    "ExecutionUncertain",
    "FreezeApplied",
    "FreezeLifted",
    "PolicyActivated",
    "PolicyDecided",
    "PolicyPublished",
    "PolicyShadowSet",
    "ProposalRejected",
    "ReconciliationRequested",
    "ReplayAwaited",
    "ReplayServed",
    "ResourceDescribed",
    "ResourceDescriptionRequested",
    "ShadowDecisionDiffered",
    "ToolCallProposed",
    "ToolDefinitionChanged",
    "ToolPinned",
    "UsageCommitted",
    "UsageLimitChanged",
    "UsageRefused",
    "UsageReleased",
    "UsageReserveRequested",
    "UsageReserved",
    "event_from_dict",
]

REQUEST_TYPES: tuple[type[Event], ...] = (ToolCallProposed, ApprovalDecisionSubmitted)

EVENT_TYPES: tuple[type[Event], ...] = (
    ToolCallProposed,
    ApprovalDecisionSubmitted,
    ProposalRejected,
    PolicyDecided,
    ResourceDescriptionRequested,
    ResourceDescribed,
    ConfirmationAccepted,
    DryRunRequested,
    ApprovalRequested,
    ApprovalGranted,
    ApprovalGrantRecorded,
    ApprovalDenied,
    ApprovalExpired,
    ApprovalDecisionRejected,
    ExecutionRequested,
    ReconciliationRequested,
    ReplayAwaited,
    ReplayServed,
    DryRunRecorded,
    DryRunFailed,
    ExecutionStarted,
    ExecutionSucceeded,
    ExecutionFailed,
    ExecutionUncertain,
    ExecutionReconciled,
    EventDeadLettered,
    PolicyPublished,
    PolicyActivated,
    PolicyShadowSet,
    ShadowDecisionDiffered,
    FreezeApplied,
    FreezeLifted,
    ToolPinned,
    ToolDefinitionChanged,
    UsageReserveRequested,
    UsageReserved,
    UsageRefused,
    UsageCommitted,
    UsageReleased,
    UsageLimitChanged,
)

BY_NAME: dict[str, type[Event]] = {cls.__name__: cls for cls in EVENT_TYPES}


def event_from_dict(event_type: str, data: dict[str, Any]) -> Event:
    """Build an event from a decoded dict; lists become tuples to keep events immutable."""
    cls = BY_NAME[event_type]
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {
        k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in fields
    }
    return cls(**kwargs)
