"""``callgate catalog draft --mcp <command-or-url>`` against the real test upstream.

The draft is a starting point for review (C10): every upstream tool gets an entry with
the strict defaults and no callers, and the upstream's input schema as its argument
schema. Merged into a profile, it loads, and no session may call a drafted tool.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from callgate.adapters.profiles import load_profile
from tests.e2e.helpers import EXIT_MISUSE, cg, run
from tests.mcp_support import DEFAULT_CEDAR, upstream_command

pytestmark = [pytest.mark.e2e]


def test_draft_from_an_upstreams_tools_list(tmp_path: Path) -> None:
    command = shlex.join(upstream_command(tmp_path / "ledger.jsonl"))
    out = tmp_path / "draft.yaml"
    answer = cg(
        tmp_path / "state",
        "catalog",
        "draft",
        "--mcp",
        command,
        "--provider",
        "notes",
        "--output",
        str(out),
    )
    assert answer["output"] == str(out) and out.read_text() == answer["yaml"]
    draft = yaml.safe_load(out.read_text())
    assert draft["providers"] == {"notes": {"kind": "mcp", "command": shlex.split(command)}}
    tools = draft["tools"]
    assert {"notes.write_note", "notes.preview_note", "notes.find_note", "notes.purge_all"} <= set(
        tools
    )
    write = tools["notes.write_note"]
    assert write["upstream_tool"] == "write_note"
    assert write["mutation"] is True and write["impact"] == "high"
    assert write["require_dry_run"] is True and write["confirmation"] == "approver"
    assert write["callers"] == [] and write["target_arg"] == "note_id"
    assert set(write["args_schema"]["properties"]) == {"note_id", "text", "author"}

    # merged into a profile it loads as is, and nobody may call a drafted tool yet
    (tmp_path / "policy.cedar").write_text(DEFAULT_CEDAR.read_text())
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"version": 1, "policy_file": "policy.cedar", **draft}))
    loaded = load_profile(profile)
    assert all(not spec.callers for spec in loaded.tools.values())
    assert loaded.provider_kind("notes") == "mcp"
    assert loaded.dry_run_missing(loaded.tools["notes.write_note"]) is not None


def test_a_broken_provider_declaration_is_misuse(tmp_path: Path) -> None:
    """``callgate mcp`` refuses to start on an unusable upstream declaration (exit 2)."""
    (tmp_path / "policy.cedar").write_text(DEFAULT_CEDAR.read_text())
    profile = tmp_path / "profile.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "policy_file": "policy.cedar",
                "providers": {"notes": {"kind": "mcp", "command": ["x"], "url": "http://h/mcp"}},
                "tools": {},
            }
        )
    )
    done = run(tmp_path / "state", "mcp", "--session", "t", profile=profile, rc=EXIT_MISUSE)
    error = done.value["error"]
    assert error["code"] == "usage", done
    assert "provider 'notes'" in error["message"] and "exactly one of" in error["message"]
