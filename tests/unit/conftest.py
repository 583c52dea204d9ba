"""The fixtures of the decider-level tests: the real processes on the memory runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.harness import Gate


@pytest.fixture
def gate(tmp_path: Path) -> Gate:
    """The real decider, executor, projections and simulated providers on the memory
    runner, over a fresh state directory and the default profile."""
    return Gate(tmp_path / "state")


@pytest.fixture
def continuing_gate(tmp_path: Path) -> Gate:
    """``gate`` with continuation on: a granted approval runs the approved call itself
    (ADR 0029), instead of the agent resubmitting it."""
    return Gate(tmp_path / "state", continuation=True)
