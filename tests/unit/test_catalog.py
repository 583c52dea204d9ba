"""The tool catalog and adoption profile (C10, C4, C7)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from callgate.adapters.profiles import load_profile
from callgate.domain.catalog import (
    Confirmation,
    Impact,
    Profile,
    ProfileError,
    default_profile_path,
)

Edit = Callable[[dict[str, Any]], None]


def write_profile(tmp_path: Path, edit: Edit | None = None, cedar: str | None = None) -> Path:
    """A copy of the default profile in ``tmp_path``, optionally edited."""
    src = default_profile_path()
    data = yaml.safe_load(src.read_text())
    if edit is not None:
        edit(data)
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cedar_path = tmp_path / data.get("policy_file", "default.cedar")
    if cedar is None:
        shutil.copy(src.parent / "default.cedar", cedar_path)
    else:
        cedar_path.write_text(cedar)
    return path


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_profile(default_profile_path())


# (mutation, impact, dry-run, confirmation, target, identity args, callers, approvers, required)
TABLE: dict[str, tuple[Any, ...]] = {
    "tickets.read": (
        False, "low", False, "none", "ticket_id", (), ("support", "admin"), (), {"ticket_id"},
    ),
    "tickets.create": (
        True, "low", False, "none", None, ("requester_id",), ("support", "admin"), (),
        {"title", "requester_id"},
    ),
    "records.update": (
        True, "low", True, "owner", "record_id", (), ("support", "admin"), (),
        {"record_id", "fields"},
    ),
    "refunds.issue": (
        True, "low", True, "owner", "order_id", ("issued_by",), ("support", "finance"),
        ("finance-approver",), {"order_id", "amount_cents", "currency"},
    ),
    "deploys.trigger": (
        True, "high", True, "approver", "service", (), ("admin", "release"),
        ("release-manager",), {"service", "version", "environment"},
    ),
    "users.delete": (
        True, "high", True, "approver", "user_id", (), ("admin",), ("admin-approver",),
        {"user_id"},
    ),
}  # fmt: skip


def test_c10_default_profile_has_exactly_the_design_tools(profile: Profile) -> None:
    assert set(profile.tools) == set(TABLE)
    assert {s.provider for s in profile.tools.values()} == {
        "tickets", "records", "refunds", "deploys", "users",
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(TABLE))
def test_c10_default_profile_matches_the_design_table(profile: Profile, name: str) -> None:
    mutation, impact, dry_run, confirmation, target, ident, callers, approvers, req = TABLE[name]
    spec = profile.tools[name]
    assert spec.name == name
    assert (spec.mutation, spec.impact, spec.require_dry_run) == (mutation, impact, dry_run)
    assert spec.confirmation == confirmation
    assert spec.target_arg == target
    assert spec.identity_args == ident
    assert spec.callers == callers
    assert spec.approvers == approvers
    assert set(spec.args_schema["required"]) == req
    assert spec.args_schema["additionalProperties"] is False


def test_c4_refund_impact_depends_on_amount(profile: Profile) -> None:
    refunds = profile.tools["refunds.issue"]
    assert not refunds.is_high_impact({"amount_cents": 9999})
    assert refunds.confirmation_for({"amount_cents": 9999}) is Confirmation.OWNER
    assert refunds.is_high_impact({"amount_cents": 10000})
    assert refunds.confirmation_for({"amount_cents": 10000}) is Confirmation.APPROVER


@pytest.mark.parametrize("args", [{}, {"amount_cents": "5"}, {"amount_cents": True}])
def test_c4_threshold_value_missing_or_not_a_number_is_high_impact(
    profile: Profile, args: dict[str, Any]
) -> None:
    assert profile.tools["refunds.issue"].confirmation_for(args) is Confirmation.APPROVER


@pytest.mark.parametrize("name", ["deploys.trigger", "users.delete"])
def test_c4_high_impact_tools_always_need_an_approver(profile: Profile, name: str) -> None:
    assert profile.tools[name].confirmation_for({}) is Confirmation.APPROVER


def test_c10_missing_safety_flags_default_to_the_strict_side(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["tools"]["x.minimal"] = {
            "provider": "records",
            "target_arg": "id",
            "approvers": ["boss"],
            "args_schema": {"type": "object", "required": ["id"], "properties": {"id": {}}},
        }

    spec = load_profile(write_profile(tmp_path, edit)).tools["x.minimal"]
    assert spec.mutation is True
    assert spec.impact is Impact.HIGH
    assert spec.require_dry_run is True
    assert spec.confirmation is Confirmation.APPROVER
    assert spec.callers == ()  # nobody may call it until the profile says who


def _set(tool: str, field: str, value: Any) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        data["tools"][tool][field] = value

    return edit


def _drop(tool: str, field: str) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        del data["tools"][tool][field]

    return edit


@pytest.mark.parametrize(
    ("edit", "tool", "field", "says"),
    [
        (_set("refunds.issue", "confirmation", "maybe"), "refunds.issue", "confirmation",
         "Input should be 'none', 'owner' or 'approver'"),
        (_set("tickets.read", "mutaton", False), "tickets.read", "mutaton", "Extra inputs"),
        (_drop("users.delete", "provider"), "users.delete", "provider", "required"),
        (_drop("users.delete", "target_arg"), "users.delete", "target_arg", "required"),
        (_set("refunds.issue", "high_impact_when", {"arg": "amount_cents", "gte": "x"}),
         "refunds.issue", "high_impact_when.gte", "valid number"),
        (_set("refunds.issue", "high_impact_when", {"arg": "nope", "gte": 1}),
         "refunds.issue", "high_impact_when.arg", "not an argument"),
        (_set("refunds.issue", "target_arg", "reason"), "refunds.issue", "target_arg",
         "must be a required argument"),
        (_set("refunds.issue", "identity_args", ["ghost"]), "refunds.issue", "identity_args",
         "not an argument"),
        (_set("users.delete", "approvers", []), "users.delete", "approvers", "approver"),
        (_set("tickets.read", "args_schema", {"type": "objekt"}), "tickets.read",
         "args_schema", "JSON Schema"),
        (_set("tickets.read", "callers", ['sup"port']), "tickets.read", "callers.0", "pattern"),
        (_set("tickets.read", "name", "other"), "tickets.read", "name", "must equal"),
    ],
)  # fmt: skip
def test_c10_broken_profile_error_names_file_tool_and_field(
    tmp_path: Path, edit: Edit, tool: str, field: str, says: str
) -> None:
    path = write_profile(tmp_path, edit)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    message = str(err.value)
    assert message.startswith(f"profile {path}: tool '{tool}': field '{field}': ")
    assert says in message


@pytest.mark.parametrize("key", [None, 1, True])
def test_c10_a_schema_key_yaml_has_and_json_has_not_is_a_profile_error(
    tmp_path: Path, key: Any
) -> None:
    """Found by fuzzing (make fuzz-campaign, target profile): ``~: {type: string}`` under
    a schema's ``properties`` escaped ``parse_profile`` as the validator's ``ValueError``
    (``Dict key must be str``), not a ``ProfileError`` naming the file, tool and field."""

    def edit(data: dict[str, Any]) -> None:
        data["tools"]["tickets.create"]["args_schema"]["properties"][key] = {"type": "string"}

    path = write_profile(tmp_path, edit)
    with pytest.raises(ProfileError) as err:
        load_profile(path)
    prefix = f"profile {path}: tool 'tickets.create': field 'args_schema': not JSON: "
    assert str(err.value).startswith(prefix), str(err.value)


def test_c10_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("tools: [unclosed\n")
    with pytest.raises(ProfileError, match=re.escape(f"profile {path}: invalid YAML")):
        load_profile(path)


def test_c10_unreadable_profile_or_policy_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ProfileError, match=re.escape(str(missing))):
        load_profile(missing)
    path = write_profile(tmp_path, _top("policy_file", "gone.cedar"))
    (tmp_path / "gone.cedar").unlink()
    with pytest.raises(ProfileError, match=r"gone\.cedar"):
        load_profile(path)


def _top(field: str, value: Any) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        data[field] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "field"),
    [(_top("version", 2), "version"), (_top("colour", "red"), "colour"),
     (_top("entry_limits", {"max_depth": 0}), "entry_limits.max_depth")],
)  # fmt: skip
def test_c10_broken_top_level_names_the_field(tmp_path: Path, edit: Edit, field: str) -> None:
    path = write_profile(tmp_path, edit)
    with pytest.raises(ProfileError, match=f"field '{field}'"):
        load_profile(path)


@pytest.mark.parametrize(
    ("target", "owner"),
    [("ORD-1", "acme"), ("billing", "acme"), ("GORD-1", "globex"), ("gx-api", "globex"),
     ("ord-1", None), ("ORD", None), ("", None), ("nowhere", None)],
)  # fmt: skip
def test_c7_resource_directory_names_the_owning_tenant(
    profile: Profile, target: str, owner: str | None
) -> None:
    assert profile.owner_of(target) == owner


def test_c7_a_target_claimed_by_two_tenants_has_no_owner(tmp_path: Path) -> None:
    path = write_profile(tmp_path, _top("resources", {"a": ["X-*"], "b": ["X-1*"]}))
    loaded = load_profile(path)
    assert loaded.owner_of("X-2") == "a"
    assert loaded.owner_of("X-12") is None


def test_c4_policy_version_changes_with_policy_text_and_catalog(tmp_path: Path) -> None:
    a, b, c, d = (tmp_path / n for n in "abcd")
    for directory in (a, b, c, d):
        directory.mkdir()
    base = load_profile(write_profile(a))
    assert load_profile(write_profile(b)).digest == base.digest  # the file location is not
    cedar = base.policy_text + "\n// reviewed\n"
    assert load_profile(write_profile(c, cedar=cedar)).digest != base.digest
    edited = write_profile(d, _set("refunds.issue", "approval_ttl_seconds", 60))
    assert load_profile(edited).digest != base.digest


def test_c10_catalog_view_lists_every_tool_with_flags_and_schema(profile: Profile) -> None:
    view = profile.catalog_view()
    json.dumps(view)  # JSON-able for `callgate catalog --json`
    by_name = {entry["name"]: entry for entry in view}
    assert set(by_name) == set(TABLE)
    refunds = by_name["refunds.issue"]
    assert refunds["mutation"] is True
    assert refunds["require_dry_run"] is True
    assert refunds["confirmation"] == "owner"
    assert refunds["high_impact_when"] == {"arg": "amount_cents", "gte": 10000}
    assert refunds["args_schema"]["properties"]["currency"]["pattern"] == "^[A-Z]{3}$"


# -- providers: and the fields of MCP upstream tools (docs/adr/0019-mcp-gateway.md) ------------


def _mcp_tool(**fields: Any) -> dict[str, Any]:
    return {
        "provider": "notes",
        "target_arg": "id",
        "approvers": ["boss"],
        "args_schema": {"type": "object", "required": ["id"], "properties": {"id": {}}},
        **fields,
    }


def test_mcp_provider_tools_name_their_upstream_tools(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["providers"] = {
            **data.get("providers", {}),
            "notes": {"kind": "mcp", "command": ["notes-server"]},
        }
        data["tools"]["notes.write"] = _mcp_tool(dry_run_tool="preview", lookup_tool="find")
        data["tools"]["notes.delete"] = _mcp_tool(upstream_tool="remove")

    profile = load_profile(write_profile(tmp_path, edit))
    write, delete = profile.tools["notes.write"], profile.tools["notes.delete"]
    assert write.upstream_name == "write" and delete.upstream_name == "remove"
    assert profile.provider_kind("notes") == "mcp" and profile.provider_kind("refunds") == (
        "simulated"
    )
    assert profile.dry_run_missing(write) is None
    missing = profile.dry_run_missing(delete)  # require_dry_run defaults to true
    assert missing is not None and "dry_run_tool" in missing
    assert profile.dry_run_missing(profile.tools["refunds.issue"]) is None  # simulated


def test_declared_providers_are_part_of_the_policy_version(tmp_path: Path) -> None:
    def declare(url: str) -> Any:
        def edit(data: dict[str, Any]) -> None:
            data["providers"] = {**data.get("providers", {}), "notes": {"kind": "mcp", "url": url}}

        return edit

    for sub in "abc":
        (tmp_path / sub).mkdir()
    a = load_profile(write_profile(tmp_path / "a", declare("http://127.0.0.1:1/mcp")))
    b = load_profile(write_profile(tmp_path / "b", declare("http://127.0.0.1:2/mcp")))
    plain = load_profile(write_profile(tmp_path / "c", lambda data: None))
    assert len({a.digest, b.digest, plain.digest}) == 3


@pytest.mark.parametrize(
    ("providers", "tool", "message"),
    [
        ({"notes": "mcp"}, None, "field 'providers.notes': Input should be a valid dictionary"),
        ({}, {"upstream_tool": "write"}, "field 'upstream_tool': only for tools of an mcp"),
        (
            {"notes": {"kind": "http", "url": "http://x"}},
            {"lookup_tool": "find"},
            "field 'lookup_tool': only for tools of an mcp provider, not http",
        ),
    ],
)
def test_provider_declarations_are_checked(
    tmp_path: Path, providers: dict[str, Any], tool: dict[str, Any] | None, message: str
) -> None:
    def edit(data: dict[str, Any]) -> None:
        data["providers"] = {**data["providers"], **providers}  # unknown kinds: the registry
        if tool is not None:
            data["tools"]["notes.write"] = _mcp_tool(**tool)

    with pytest.raises(ProfileError, match=message.replace("(", r"\(")):
        load_profile(write_profile(tmp_path, edit))


# -- resources and prompts of an mcp upstream (ADR 0044) ------------------------------------

_URI_SCHEMA = {
    "type": "object",
    "required": ["uri"],
    "properties": {"uri": {"type": "string"}},
    "additionalProperties": False,
}


def _resource_entry(name: str, uris: list[str]) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        data["tools"][name] = {
            "provider": data["tools"]["tickets.read"]["provider"],
            "upstream_method": "resources/read",
            "uris": uris,
            "mutation": False,
            "impact": "low",
            "require_dry_run": False,
            "confirmation": "none",
            "target_arg": "uri",
            "callers": ["support"],
            "args_schema": _URI_SCHEMA,
        }

    return edit


def test_a_resource_uri_maps_to_exactly_one_entry_else_none(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        _resource_entry("docs.read", ["docs://*"])(data)
        _resource_entry("docs.secret", ["docs://secret/*"])(data)

    p = load_profile(write_profile(tmp_path, edit))
    found = p.resource_entry("docs://readme")
    assert found is not None and found.name == "docs.read"
    assert p.resource_entry("docs://secret/keys") is None  # two entries cover it: fail closed
    assert p.resource_entry("DOCS://readme") is None  # globs are case-sensitive
    assert p.resource_entry("other://x") is None  # not catalogued
    assert p.prompt_entry("tickets", "nothing") is None


def test_resource_entries_are_checked_and_old_entries_keep_their_digest(tmp_path: Path) -> None:
    base = load_profile(default_profile_path())
    (tmp_path / "a").mkdir()
    same = load_profile(write_profile(tmp_path / "a", _set("tickets.read", "uris", [])))
    assert same.digest == base.digest  # an entry at the defaults keeps the policy version
    for i, (edit, says) in enumerate(
        (
            (_set("tickets.read", "uris", ["t://*"]), "only a resources/read entry covers URIs"),
            (_set("tickets.read", "upstream_method", "resources/read"), "target_arg 'uri'"),
            (_set("tickets.read", "upstream_method", "tools/list"), "Input should be"),
        )
    ):
        folder = tmp_path / f"e{i}"
        folder.mkdir()
        with pytest.raises(ProfileError, match=re.escape(says)):
            load_profile(write_profile(folder, edit))
