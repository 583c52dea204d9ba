"""The HTTP provider against the reference server, started for real (C5, C8, C12).

A profile whose ``crm`` tools run on ``kind: http`` (credentials from an environment
variable, a 1 s timeout); the SDK on the embedded backend. The whole lifecycle: a read;
an update through dry-run, owner approval and execution with the idempotency token; a
replay that does not reach the provider; and a create whose answer comes only after the
effect was applied and callgate timed out: ``outcome_uncertain``, then the retry
reconciles with ``lookup`` and replays the real result. Exactly one effect each, and the
server saw exactly one execute request per token.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.provider_server import ReferenceServer

from callgate.bootstrap import Settings
from callgate.domain.catalog import default_profile_path
from callgate.surfaces.sdk import Gateway, connect

CREDENTIAL = "crm-credential-for-tests"
# A policy on an attribute the provider reports (Cedar entity attributes, ADR 0014).
VIP_POLICY = """
@id("vip-contacts-need-admin")
forbid (principal, action == Action::"crm.read", resource)
when { resource has vip && resource.vip == true }
unless { principal.roles.contains("admin") };
"""


def crm_profile(folder: Path, base_url: str) -> Path:
    """The default profile plus three ``crm`` tools on an HTTP provider."""
    source = default_profile_path()
    raw = yaml.safe_load(source.read_text())
    raw["providers"]["crm"] = {
        "kind": "http",
        "base_url": base_url,
        "credentials": {"env": "CRM_TOKEN"},
        "timeout_s": 1,
        "retries": 1,
    }
    # No static resources for C-*: the provider owns the answer (describe, C7).
    common: dict[str, Any] = {"provider": "crm", "callers": ["support"]}
    contact = {"type": "string", "minLength": 1, "maxLength": 64}
    raw["tools"]["crm.read"] = {
        **common, "mutation": False, "impact": "low", "require_dry_run": False,
        "confirmation": "none", "target_arg": "contact_id",
        "args_schema": {"type": "object", "required": ["contact_id"],
                        "properties": {"contact_id": contact}, "additionalProperties": False},
    }  # fmt: skip
    raw["tools"]["crm.update"] = {
        **common, "impact": "low", "require_dry_run": True, "confirmation": "owner",
        "target_arg": "contact_id",
        "args_schema": {"type": "object", "required": ["contact_id", "fields"],
                        "properties": {"contact_id": contact, "fields": {"type": "object"}},
                        "additionalProperties": False},
    }  # fmt: skip
    raw["tools"]["crm.create"] = {
        **common, "impact": "low", "require_dry_run": False, "confirmation": "none",
        "target_arg": None,
        "args_schema": {"type": "object", "required": ["name"],
                        "properties": {"name": {"type": "string"}}, "additionalProperties": False},
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(source.parent / raw["policy_file"], folder / raw["policy_file"])
    with (folder / raw["policy_file"]).open("a") as policy:
        policy.write(VIP_POLICY)
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture
def reference_provider(tmp_path: Path) -> Iterator[ReferenceServer]:
    started = ReferenceServer(CREDENTIAL, tmp_path / "provider.log")
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def reference_provider_gateway(
    tmp_path: Path, reference_provider: ReferenceServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Gateway]:
    monkeypatch.setenv("CRM_TOKEN", CREDENTIAL)
    profile = crm_profile(tmp_path / "profile", reference_provider.url)
    g = connect(Settings(state_dir=tmp_path / "state", profile=profile, dev=True))
    try:
        yield g
    finally:
        g.close()


def test_the_whole_lifecycle_against_the_reference_server(
    reference_provider_gateway: Gateway, reference_provider: ReferenceServer
) -> None:
    ada = {"id": "C-1", "tenant": "acme", "attributes": {"name": "Ada", "tier": "gold"}}
    reference_provider.control("POST", "resources", ada)
    alice = reference_provider_gateway.app.session_issuer.issue(
        "alice", "acme", ["support"], reference_provider_gateway.app.clock()
    )

    read = reference_provider_gateway.propose(alice, "crm.read", {"contact_id": "C-1"})
    assert read["outcome"] == "executed", read
    assert read["result"] == {"id": "C-1", "name": "Ada", "tier": "gold"}

    # Dry-run (C5): what the owner confirms comes from the provider.
    update = {"contact_id": "C-1", "fields": {"tier": "platinum"}}
    first = reference_provider_gateway.propose(alice, "crm.update", update, idempotency_key="u-1")
    assert first["outcome"] == "approval_required", first
    assert first["dry_run"]["current"] == {"name": "Ada", "tier": "gold"}
    assert first["dry_run"]["changes"] == {"tier": "platinum"}
    approval = reference_provider_gateway.approve(first["invocation_id"], alice)
    assert approval["outcome"] == "executed", approval  # the approved call ran (ADR 0029)
    done = reference_provider_gateway.wait(first["invocation_id"], alice)
    assert done["outcome"] == "executed", done
    assert done["result"]["tier"] == "platinum"
    # Replay (C8): the stored result, no second request to the provider.
    again = reference_provider_gateway.propose(alice, "crm.update", update, idempotency_key="u-1")
    assert again["outcome"] == "replayed" and again["result"] == done["result"]
    seen = reference_provider.control("GET", "effects")
    [effect] = seen["effects"]  # the read applied nothing
    assert effect["tool"] == "crm.update"
    assert seen["execute_requests"][effect["token"]] == 1

    # Timeout after the effect was applied (C12): uncertain, then reconciled, one effect.
    reference_provider.control("POST", "faults", {"delay_after_apply_s": 2.5, "times": 1})
    created = reference_provider_gateway.propose(
        alice, "crm.create", {"name": "Grace"}, idempotency_key="c-1"
    )
    assert created["outcome"] == "outcome_uncertain", created
    retry = reference_provider_gateway.propose(
        alice, "crm.create", {"name": "Grace"}, idempotency_key="c-1"
    )
    assert retry["outcome"] == "replayed", retry
    assert retry["result"]["name"] == "Grace" and retry["result"]["id"].startswith("R-")
    status = reference_provider_gateway.status(created["invocation_id"], alice)
    assert status is not None and status["outcome"] == "executed"
    seen = reference_provider.control("GET", "effects")
    creates = [e for e in seen["effects"] if e["tool"] == "crm.create"]
    assert len(creates) == 1 and creates[0]["result"] == retry["result"]
    assert seen["execute_requests"][creates[0]["token"]] == 1  # never a blind second execute

    # Ownership from the provider (C7): the created contact is the creator's tenant's.
    new_id = retry["result"]["id"]
    assert (
        reference_provider_gateway.propose(alice, "crm.read", {"contact_id": new_id})["outcome"]
        == "executed"
    )
    gina = reference_provider_gateway.app.session_issuer.issue(
        "gina", "globex", ["support"], reference_provider_gateway.app.clock()
    )
    theirs = reference_provider_gateway.propose(gina, "crm.read", {"contact_id": "C-1"})
    assert theirs["outcome"] == "tool_forbidden", theirs
    vip = {"id": "C-2", "tenant": "acme", "attributes": {"name": "Bo", "vip": True}}
    reference_provider.control("POST", "resources", vip)
    refused = reference_provider_gateway.propose(alice, "crm.read", {"contact_id": "C-2"})
    assert refused["outcome"] == "tool_forbidden", refused
    [record] = reference_provider_gateway.audit(refused["invocation_id"], session=alice)
    assert record["authorized_by"]["determining_policies"] == ["vip-contacts-need-admin"]


def test_a_wrong_credential_is_a_definite_failure(
    tmp_path: Path, reference_provider: ReferenceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRM_TOKEN", "not-the-credential")
    profile = crm_profile(tmp_path / "profile", reference_provider.url)
    g = connect(Settings(state_dir=tmp_path / "state", profile=profile, dev=True))
    try:
        alice = g.app.session_issuer.issue("alice", "acme", ["support"], g.app.clock())
        answer = g.propose(alice, "crm.create", {"name": "x"}, idempotency_key="c-2")
        assert answer["outcome"] == "execution_failed", answer
        assert "HTTP 401" in answer["error"]["message"]
    finally:
        g.close()
    assert reference_provider.control("GET", "effects")["effects"] == []
