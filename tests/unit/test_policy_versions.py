"""The fold of the policy-version events (ADR 0050): pure, in log order, fail closed."""

from __future__ import annotations

from typing import Any

import pytest

from callgate.domain import events as ev
from callgate.domain.catalog import default_profile_path
from callgate.domain.codes import Code, Rejection
from callgate.domain.policy_versions import PolicyVersions, content_of, evolve, fold, profile_of

PATH = default_profile_path()
YAML = PATH.read_text(encoding="utf-8")
CEDAR = (PATH.parent / "default.cedar").read_text(encoding="utf-8")


def _common(event_id: str, version: str) -> dict[str, Any]:
    return {
        "event_id": event_id, "invocation_id": "policy", "partition_key": ev.POLICY_KEY,
        "author": "olga", "tenant": "ops", "reason": "r", "version": version,
    }  # fmt: skip


def _published(event_id: str, cedar: str = CEDAR) -> ev.PolicyPublished:
    version = content_of(YAML, cedar).digest
    return ev.PolicyPublished(profile_yaml=YAML, policy_text=cedar, **_common(event_id, version))


def test_activation_follows_log_order_and_rollback_is_an_earlier_version() -> None:
    a = _published("a")
    b = _published("b", CEDAR + '\nforbid (principal, action == Action::"tickets.read", resource);')
    versions = fold([
        a, b,
        ev.PolicyActivated(**_common("x", b.version)),
        ev.PolicyActivated(**_common("y", a.version)),
    ])  # fmt: skip
    assert versions.active == a.version
    assert [h.action for h in versions.history] == [
        "published", "published", "activated", "activated",
    ]  # fmt: skip
    assert profile_of(versions.published[b.version]).digest == b.version


def test_an_unpublished_activation_or_a_redelivery_changes_nothing() -> None:
    a = _published("a")
    versions = evolve(PolicyVersions(), a)
    forged = ev.PolicyActivated(**_common("x", "f" * 64))  # never published
    assert evolve(versions, forged).history == versions.history
    assert versions.active == ""
    activation = ev.PolicyActivated(**_common("y", a.version))
    versions = evolve(versions, activation)
    assert versions.active == a.version
    assert evolve(versions, activation) is versions  # the same event again
    assert len(versions.history) == 2
    with pytest.raises(Rejection) as unknown:
        versions.require_published(a.version.upper())  # exact: a digest as written
    assert unknown.value.code is Code.POLICY_VERSION_UNKNOWN


def test_content_that_does_not_parse_or_does_not_match_its_version_is_refused() -> None:
    with pytest.raises(Rejection) as bad:
        content_of(YAML, "forbid (principal, action")
    assert bad.value.code is Code.POLICY_VERSION_INVALID
    forged = ev.PolicyPublished(
        profile_yaml=YAML,
        policy_text=CEDAR + "\n// changed",
        **_common("z", _published("a").version),
    )
    with pytest.raises(Rejection) as mismatch:
        profile_of(forged)
    assert mismatch.value.code is Code.POLICY_VERSION_INVALID
