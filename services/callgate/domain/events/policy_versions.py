"""Policy versions on the ``events`` topic (ADR 0050): published, activated, set as shadow,
and the decisions where the shadow would have differed.
"""

from __future__ import annotations

from callgate.domain.events.envelope import Event, event_class

# Every policy-version event shares one partition key, so on Kafka they keep one order.
POLICY_KEY = "policy"


@event_class
class PolicyPublished(Event):
    """An operator published a catalog+policy version; ``version`` is its digest.

    The content travels whole (``profile_yaml``, ``policy_text``): the version is the digest
    of what ``parse_profile`` reads from them, so the event is its own content address."""

    version: str
    author: str
    tenant: str
    reason: str
    profile_yaml: str
    policy_text: str


@event_class
class PolicyActivated(Event):
    """An operator made a published version the one every decider decides with, from this
    event's position in the log on (rolling back: activating an earlier version)."""

    version: str
    author: str
    tenant: str
    reason: str


@event_class
class PolicyShadowSet(Event):
    """An operator set the published version decided beside the active one on every live
    call (``version`` empty: shadowing off). A shadow never changes an outcome."""

    version: str
    author: str
    tenant: str
    reason: str


@event_class
class ShadowDecisionDiffered(Event):
    """The shadow version decided a live call otherwise than the active version did."""

    tool: str
    actor: str
    call_tenant: str
    active_version: str
    active_outcome: str
    candidate_version: str
    candidate_outcome: str
    reason: str
    # The verified session's agent and delegation chain, beside the user (issue 38.4):
    # ``Principal.agent`` and ``Principal.delegation``; empty in records written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()
