"""Policy versions as events (ADR 0050): what was published, which version is active,
which one runs in shadow, folded in log order from ``PolicyPublished``,
``PolicyActivated`` and ``PolicyShadowSet``.

The fold is pure: every process that reads the same events in the same order holds the
same active version after the same event, which is how every decider switches at one log
position. A version's content travels in its ``PolicyPublished`` event and its version is
the digest ``parse_profile`` computes from that content, so a version cannot be activated
under a name that is not what it holds.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from callgate.domain import events as ev
from callgate.domain.catalog import Profile, ProfileError, parse_profile
from callgate.domain.codes import Code, Rejection
from callgate.domain.policy import PolicyEngine

POLICY_EVENTS: tuple[type[ev.Event], ...] = (
    ev.PolicyPublished,
    ev.PolicyActivated,
    ev.PolicyShadowSet,
)

# The name a published profile's policy file is read under (its content is in the event).
_POLICY_NAME = "published.cedar"


def profile_of(published: ev.PolicyPublished) -> Profile:
    """The checked profile a ``PolicyPublished`` carries (``ProfileError`` if it does not
    parse, or ``policy_version_invalid`` when its digest is not its ``version``)."""
    profile = parse_profile(
        published.profile_yaml,
        Path(f"published/{published.version}.yaml"),
        lambda _path: published.policy_text,
        recorded=True,
    )
    if profile.digest != published.version:
        raise Rejection(
            Code.POLICY_VERSION_INVALID,
            f"published content has digest {profile.digest}, not {published.version}",
        )
    return profile


def content_of(profile_yaml: str, policy_text: str) -> Profile:
    """The profile a publish would record (``policy_version_invalid`` naming the problem
    when the catalog or the policy does not parse)."""
    try:
        profile = parse_profile(profile_yaml, Path("candidate.yaml"), lambda _path: policy_text)
        PolicyEngine(profile)  # the Cedar text is parsed here
        return profile
    except ProfileError as exc:
        raise Rejection(Code.POLICY_VERSION_INVALID, str(exc)) from None


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One line of ``callgate policy history``: who did what to which version, when, why."""

    at: int
    action: str  # published | activated | shadow | shadow_off
    version: str
    author: str
    tenant: str
    reason: str

    def to_json(self) -> dict[str, object]:
        return {
            "at": self.at,
            "action": self.action,
            "version": self.version,
            "author": self.author,
            "tenant": self.tenant,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class PolicyVersions:
    """The fold of the policy-version events (``evolve``): published content, active and
    shadow, as an immutable value (a decider holds a reference and replaces it)."""

    published: Mapping[str, ev.PolicyPublished] = field(
        default_factory=lambda: MappingProxyType({})
    )
    active: str = ""  # "" : none activated on the log (the profile file decides)
    shadow: str = ""
    history: tuple[HistoryEntry, ...] = ()
    seen: frozenset[str] = frozenset()

    def require_published(self, version: str) -> ev.PolicyPublished:
        """The published version named ``version`` (``policy_version_unknown`` otherwise).
        Exact: a version is a digest, compared as written."""
        found = self.published.get(version)
        if found is None:
            raise Rejection(Code.POLICY_VERSION_UNKNOWN, f"no published policy version {version!r}")
        return found


def evolve(versions: PolicyVersions, event: ev.Event) -> PolicyVersions:
    """``versions`` after ``event``. An event of another type or redelivered (same
    ``event_id``) changes nothing; an activation or shadow of a version never published
    (refused at the gateway: a forged one) is ignored."""
    if not isinstance(event, POLICY_EVENTS) or event.event_id in versions.seen:
        return versions
    seen = versions.seen | {event.event_id}
    if isinstance(event, ev.PolicyPublished):
        published = versions.published
        if event.version not in published:
            published = MappingProxyType({**published, event.version: event})
        entry = _entry(event, "published", event.version)
        return replace(versions, published=published, history=(*versions.history, entry), seen=seen)
    if isinstance(event, ev.PolicyActivated):
        if event.version not in versions.published:
            return replace(versions, seen=seen)
        entry = _entry(event, "activated", event.version)
        return replace(
            versions, active=event.version, history=(*versions.history, entry), seen=seen
        )
    assert isinstance(event, ev.PolicyShadowSet)
    if event.version and event.version not in versions.published:
        return replace(versions, seen=seen)
    entry = _entry(event, "shadow" if event.version else "shadow_off", event.version)
    return replace(versions, shadow=event.version, history=(*versions.history, entry), seen=seen)


def _entry(
    event: ev.PolicyPublished | ev.PolicyActivated | ev.PolicyShadowSet, action: str,
    version: str,
) -> HistoryEntry:  # fmt: skip
    return HistoryEntry(
        event.occurred_at, action, version, event.author, event.tenant, event.reason
    )


def fold(events: Iterable[ev.Event]) -> PolicyVersions:
    return functools.reduce(evolve, events, PolicyVersions())


__all__ = [
    "POLICY_EVENTS",
    "HistoryEntry",
    "PolicyVersions",
    "content_of",
    "evolve",
    "fold",
    "profile_of",
]
