"""An access request's approval continues nothing (ADR 0090): once granted it is final,
whatever the tool's ``continue_on_approval`` says, so an approver's grant is answered at
once instead of waiting for a continuation that never comes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from callgate.bootstrap import Settings, bootstrap
from callgate.domain.access_requests import TASK_PREFIX


def granted(invocation_id: str) -> dict[str, Any]:
    return {
        "invocation_id": invocation_id,
        "tool": "deploys.trigger",
        "settled": True,
        "outcome": "approval_required",
        "approval": {"state": "granted", "approval_id": "apr-1"},
    }


def test_a_granted_access_request_is_final_where_a_granted_call_continues(tmp_path: Path) -> None:
    app = bootstrap(Settings(state_dir=tmp_path / "state", dev=True))
    spec = app.profile.tool("deploys.trigger")
    assert spec is not None and spec.continue_on_approval  # a call of it goes on
    gate = app.gateway()
    try:
        assert gate.is_final(granted(f"{TASK_PREFIX}0f3a")) is True
        assert gate.is_final(granted("0f3a")) is False  # waits for the call to continue
    finally:
        gate.close()
