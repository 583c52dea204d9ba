"""Created-resource ownership through the installed command, embedded backend (C7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import cg, propose, session
from tests.e2e.ownership import created_ticket_ownership

pytestmark = pytest.mark.e2e


def test_a_created_ticket_belongs_to_its_tenant_and_replay_agrees(tmp_path: Path) -> None:
    state = tmp_path / "state"

    def ask(token: str, tool: str, args: dict[str, Any], key: str | None) -> dict[str, Any]:
        return propose(state, token, tool, args, key)

    created_ticket_ownership(lambda u, t, r: session(state, u, t, r), ask, "own-1")
    # The decisions are reproduced from the log, descriptions included (ADR 0014).
    assert cg(state, "replay")["equal"] is True
    assert cg(state, "audit", "verify")["ok"] is True
