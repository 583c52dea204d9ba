"""What an opened MCP ``requestState`` holds (``rounds.Round``, ADR 0065): read by the
strict reader, so anything callgate did not mint is a ``ValueError``, never another error."""

from __future__ import annotations

import pytest

from callgate.surfaces.mcp.rounds import Round


def test_a_round_dumps_and_loads_back_to_itself() -> None:
    state = Round("inv-1", 1_800_000_000_000, asks=True)
    assert Round.load(state.dump()) == state


@pytest.mark.parametrize(
    "text",
    [
        "[" * 5000,  # found by the fuzz target state: a RecursionError before
        '{"invocation_id": "a", "since_ms": 1, "since_ms": 2}',
        '{"invocation_id": "a", "since_ms": true}',
        '{"invocation_id": "a", "since_ms": NaN}',
        '{"invocation_id": "\\ud800", "since_ms": 1}',
        "",
    ],
)
def test_a_state_callgate_did_not_mint_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        Round.load(text)
