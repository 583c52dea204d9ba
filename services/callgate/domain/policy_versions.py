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

from dataclasses import dataclass, field
from pathlib import Path

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


@dataclass(slots=True)
class PolicyVersions:
    """The fold of the policy-version events: published content, active and shadow."""

    published: dict[str, ev.PolicyPublished] = field(default_factory=dict)
    active: str = ""  # "" : none activated on the log (the profile file decides)
    shadow: str = ""
    history: list[HistoryEntry] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)

    def apply(self, event: ev.Event) -> bool:
        """Fold one event; whether it changed the active or shadow version. A redelivered
        event (same ``event_id``) changes nothing."""
        if not isinstance(event, POLICY_EVENTS) or event.event_id in self.seen:
            return False
        self.seen.add(event.event_id)
        if isinstance(event, ev.PolicyPublished):
            self.published.setdefault(event.version, event)
            self._note(event, "published", event.version)
            return False
        if isinstance(event, ev.PolicyActivated):
            if event.version not in self.published:
                return False  # refused at the gateway; a forged one is ignored
            self._note(event, "activated", event.version)
            changed = self.active != event.version
            self.active = event.version
            return changed
        assert isinstance(event, ev.PolicyShadowSet)
        if event.version and event.version not in self.published:
            return False
        self._note(event, "shadow" if event.version else "shadow_off", event.version)
        changed = self.shadow != event.version
        self.shadow = event.version
        return changed

    def _note(
        self, event: ev.PolicyPublished | ev.PolicyActivated | ev.PolicyShadowSet, action: str,
        version: str,
    ) -> None:  # fmt: skip
        self.history.append(
            HistoryEntry(
                event.occurred_at, action, version, event.author, event.tenant, event.reason
            )
        )

    def require_published(self, version: str) -> ev.PolicyPublished:
        """The published version named ``version`` (``policy_version_unknown`` otherwise).
        Exact: a version is a digest, compared as written."""
        found = self.published.get(version)
        if found is None:
            raise Rejection(Code.POLICY_VERSION_UNKNOWN, f"no published policy version {version!r}")
        return found


def fold(events: list[ev.Event]) -> PolicyVersions:
    versions = PolicyVersions()
    for event in events:
        versions.apply(event)
    return versions


__all__ = [
    "POLICY_EVENTS",
    "HistoryEntry",
    "PolicyVersions",
    "content_of",
    "fold",
    "profile_of",
]
