"""The MCP provider against the real test upstream, as the executor calls it (C5, C12).

``McpProvider`` is driven through the provider interface only; the upstream is
``tests/mcp_upstream.py`` started over stdio from the profile. Also the start-up check of
``callgate mcp`` that the catalog still fits the upstream.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from tests.mcp_support import effects, inject, write_profile

from callgate.bootstrap import App, Settings, bootstrap
from callgate.providers.base import ProviderError, ProviderTimeout
from callgate.providers.mcp import McpProvider
from callgate.surfaces.mcp.drift import schema_drift, upstream_drift

NOTE = {"note_id": "N-1", "text": "hello", "author": "alice"}


@pytest.fixture
def notes_app(tmp_path: Path) -> Iterator[App]:
    # 3 s: only the injected fault may time out, even on a loaded machine
    profile = write_profile(tmp_path / "profile", tmp_path / "notes.jsonl", timeout_s=3.0)
    notes_app = bootstrap(Settings(state_dir=tmp_path / "state", profile=profile))
    try:
        yield notes_app
    finally:
        notes_app.providers.close()


def notes(notes_app: App) -> McpProvider:
    (provider,) = (p for p in notes_app.providers.of_kind(McpProvider) if p.name == "notes")
    return provider


def test_dry_run_execute_lookup_map_to_the_declared_tools(notes_app: App, tmp_path: Path) -> None:
    p = notes(notes_app)
    preview = p.dry_run("notes.write", "N-1", NOTE, "acme").snapshot
    assert preview["structuredContent"] == {"note_id": "N-1", "before": None, "after": "hello"}
    assert effects(tmp_path / "notes.jsonl") == []  # a dry-run applies nothing

    done = p.execute("notes.write", "N-1", NOTE, "acme", "tok-1", "inv-1").result
    assert done["structuredContent"] == NOTE
    (effect,) = effects(tmp_path / "notes.jsonl")
    assert (effect["token"], effect["invocation_id"], effect["tenant"]) == (
        "tok-1",
        "inv-1",
        "acme",
    )

    found = p.lookup("tok-1", "notes.write")
    assert found.found and found.result is not None and found.result["structuredContent"] == NOTE
    assert not p.lookup("tok-other", "notes.write").found


def test_failures_split_by_what_is_known_about_the_effect(notes_app: App, tmp_path: Path) -> None:
    p = notes(notes_app)
    ledger = tmp_path / "notes.jsonl"
    inject(ledger, "write_note", "timeout_after_apply")
    with pytest.raises(ProviderTimeout):  # applied, then silent: outcome unknown
        p.execute("notes.quick_write", "N-2", NOTE, "acme", "tok-2", "inv-2")
    assert p.lookup("tok-2", "notes.quick_write").found  # the session is still usable
    inject(ledger, "write_note", "fail")
    with pytest.raises(ProviderError, match="upstream reported an error"):
        p.execute("notes.quick_write", "N-3", NOTE, "acme", "tok-3", "inv-3")
    with pytest.raises(ProviderError, match="no lookup_tool"):  # stays uncertain (C12)
        p.lookup("tok-4", "notes.send")
    with pytest.raises(ProviderError, match="not one of this upstream's tools"):
        p.execute("refunds.issue", "ORD-1", {}, "acme", "tok-5", "inv-5")
    assert len(effects(ledger, "write_note")) == 1


def test_an_unreachable_upstream_is_a_definite_failure(tmp_path: Path) -> None:
    profile = write_profile(tmp_path / "p", tmp_path / "l.jsonl", url="http://127.0.0.1:9/mcp")
    doc = yaml.safe_load(profile.read_text())
    doc["providers"]["notes"]["connect_timeout_s"] = 5
    profile.write_text(yaml.safe_dump(doc))
    notes_app = bootstrap(Settings(state_dir=tmp_path / "s", profile=profile))
    try:
        with pytest.raises(ProviderError, match="cannot connect"):  # nothing was sent
            notes(notes_app).execute("notes.quick_write", "N-1", NOTE, "acme", "t", "i")
    finally:
        notes_app.providers.close()


def test_startup_check_names_what_no_longer_fits(tmp_path: Path) -> None:
    profile = write_profile(tmp_path / "p", tmp_path / "l.jsonl")
    doc = yaml.safe_load(profile.read_text())
    doc["tools"]["notes.send"]["upstream_tool"] = "send_fax"
    schema = doc["tools"]["notes.read"]["args_schema"]  # shared with other tools (YAML alias)
    props = {**schema["properties"], "shelf": {"type": "string"}}
    doc["tools"]["notes.read"]["args_schema"] = {**schema, "properties": props}
    profile.write_text(yaml.safe_dump(doc))
    notes_app = bootstrap(Settings(state_dir=tmp_path / "s", profile=profile))
    try:
        warnings = upstream_drift(notes_app)
    finally:
        notes_app.providers.close()
    assert warnings == [
        "notes.read: the catalog allows arguments the upstream does not take: ['shelf']",
        "notes.send: upstream_tool 'send_fax' is not listed by the upstream",
    ]


def test_the_test_profile_fits_its_upstream(notes_app: App) -> None:
    assert upstream_drift(notes_app) == []


@pytest.mark.parametrize(
    ("catalog", "upstream", "expected"),
    [
        ({"properties": {"a": {}}}, {"properties": {"a": {}, "b": {}}}, []),
        ({"properties": {"a": {}, "x": {}}}, {"properties": {"a": {}}}, ["does not take: ['x']"]),
        (
            {"properties": {"a": {}}, "required": []},
            {"properties": {"a": {}}, "required": ["a"]},
            ["does not require: ['a']"],
        ),
        ({"properties": {"x": {}}}, {}, []),  # an upstream that takes anything
    ],
)
def test_schema_drift(
    catalog: dict[str, object], upstream: dict[str, object], expected: list[str]
) -> None:
    found = schema_drift(catalog, upstream)
    assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found, strict=True))
