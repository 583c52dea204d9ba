"""Providers from the profile (``providers:``): kinds, settings and errors at load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from callgate.adapters.profiles import load_profile
from callgate.domain.catalog import ProfileError, default_profile_path
from callgate.providers.http import HttpProvider
from callgate.providers.ledger import EffectLedger
from callgate.providers.registry import BuildContext, build_registry, default_context
from callgate.providers.simulated import FaultPlan, TicketsProvider


def profile_with(tmp_path: Path, providers: dict[str, Any] | None, **tool: Any) -> Path:
    source = default_profile_path()
    raw = yaml.safe_load(source.read_text())
    if providers is None:
        raw.pop("providers")
    else:
        raw["providers"] = providers
    raw["tools"]["tickets.read"].update(tool)
    (tmp_path / "default.cedar").write_text((source.parent / "default.cedar").read_text())
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


SIMULATED = {
    n: {"kind": "simulated"} for n in ("tickets", "records", "refunds", "deploys", "users")
}


def context(tmp_path: Path, environ: dict[str, str] | None = None) -> BuildContext:
    return BuildContext(
        ledger=lambda: EffectLedger(tmp_path / "effects.sqlite"),
        faults=FaultPlan.none(),
        environ=environ or {},
        profile_dir=tmp_path,
    )


def test_the_default_profile_names_the_bundled_simulations(tmp_path: Path) -> None:
    profile = load_profile(default_profile_path())
    registry = build_registry(
        profile, default_context(lambda: EffectLedger(tmp_path / "e.sqlite"), {}, profile)
    )
    assert registry.names() == ["deploys", "records", "refunds", "tickets", "users"]
    assert isinstance(registry.get("tickets"), TicketsProvider)
    # Without providers: the same, implicitly (profiles written before the map existed).
    legacy = load_profile(profile_with(tmp_path, None))
    assert build_registry(legacy, context(tmp_path)).names() == registry.names()


def test_an_http_provider_with_credentials_from_env_or_file(tmp_path: Path) -> None:
    (tmp_path / "crm.token").write_text("s3cret-file\n")
    providers = {
        **SIMULATED,
        "crm": {"kind": "http", "base_url": "http://127.0.0.1:9", "timeout_s": 2,
                "retries": 2, "credentials": {"env": "CRM_TOKEN"}},
        "erp": {"kind": "http", "base_url": "https://erp.example",
                "credentials": {"file": "crm.token"}},
        "tix": {"kind": "simulated", "simulation": "tickets"},
    }  # fmt: skip
    profile = load_profile(profile_with(tmp_path, providers, provider="crm"))
    registry = build_registry(profile, context(tmp_path, {"CRM_TOKEN": "s3cret-env"}))
    crm = registry.get("crm")
    assert isinstance(crm, HttpProvider)
    assert (crm.base_url, crm.timeout_s, crm.retries) == ("http://127.0.0.1:9", 2, 2)
    assert crm._auth == {"Authorization": "Bearer s3cret-env"}
    assert "s3cret" not in repr(crm)
    erp = registry.get("erp")
    assert isinstance(erp, HttpProvider) and erp._auth["Authorization"] == "Bearer s3cret-file"
    assert isinstance(registry.get("tix"), TicketsProvider) and registry.get("tix").name == "tix"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"kind": "smtp"},
            "providers.crm.kind: unknown provider kind 'smtp' (http, mcp, simulated)",
        ),
        ({"base_url": "http://x"}, "providers.crm.kind: required"),
        ({"kind": "http"}, "providers.crm.base_url: Field required"),
        ({"kind": "http", "base_url": "ftp://x"}, "providers.crm.base_url: String should match"),
        ({"kind": "http", "base_url": "http://x", "timeout": 3}, "providers.crm.timeout: Extra"),
        (
            {"kind": "http", "base_url": "http://x", "credentials": {"env": "A", "file": "b"}},
            "providers.crm.credentials: Value error, give exactly one of 'env' and 'file'",
        ),
        (
            {"kind": "http", "base_url": "http://x", "credentials": {"env": "CRM_TOKEN"}},
            "providers.crm: environment variable CRM_TOKEN is not set",
        ),
        ({"kind": "simulated"}, "providers.crm: no bundled simulation 'crm'"),
    ],
)
def test_a_bad_provider_entry_fails_at_load_naming_the_key(
    tmp_path: Path, entry: dict[str, Any], message: str
) -> None:
    path = profile_with(tmp_path, {**SIMULATED, "crm": entry}, provider="crm")
    with pytest.raises(ProfileError) as err:
        build_registry(load_profile(path), context(tmp_path))
    assert str(err.value).startswith(f"profile {path}: ")
    assert message in str(err.value)


def test_a_tool_naming_an_undeclared_provider_is_refused(tmp_path: Path) -> None:
    path = profile_with(tmp_path, SIMULATED, provider="crm")
    with pytest.raises(ProfileError, match=r"tool 'tickets\.read': field 'provider': no provider"):
        load_profile(path)
