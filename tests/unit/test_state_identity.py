"""The embedded runner's "same object, same state" shortcut (ADR 0006, "Throughput").

The runner skips ``dump_state`` for a key when a projection hands back the very state object
it was given, so it relies on projections never changing a state in place. These tests would
catch a projection that does (its stored bytes would silently go stale), and pin down that
the shortcut is taken for projections only: the decider and the executor update their states
in place and must always be dumped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given, settings
from tests.unit.test_projections import logs  # every ``events`` type, fields drawn

from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain.events import Event
from callgate.domain.process_port import Process
from callgate_projections import keeps_states_immutable

NOW = 1_800_000_000_000


def _projections() -> list[Process[Any]]:
    """Every projection ``callgate serve`` runs (a new one is covered when it is wired in)."""
    return App(Settings(state_dir=Path("unused")), clock=lambda: NOW).projections()


@settings(max_examples=80, deadline=None)
@given(log=logs())
def test_projections_never_change_the_state_they_are_given(log: list[Event]) -> None:
    """Fold each projection over a log, making every call a runner makes; the state passed
    in dumps to the same bytes afterwards, and an unchanged result is the same object."""
    for projection in _projections():
        assert keeps_states_immutable(projection)
        states: dict[str, Any] = {}
        for event in log:
            old = states.get(event.partition_key, projection.initial_state())
            before = projection.dump_state(old)
            new, _ = projection.handle(old, event, NOW)
            assert projection.dump_state(old) == before, f"{projection.name} changed its state"
            later, _ = projection.follow_up(new, [event], NOW)
            assert later is new
            for call in (projection.due, projection.recover):
                same, outputs = call(new, NOW)
                assert same is new and not outputs
            states[event.partition_key] = new


def test_the_shortcut_is_for_projections_only(tmp_path: Path) -> None:
    """The invocations process changes states in place: never skipped (ADR 0006)."""
    app = bootstrap(Settings(state_dir=tmp_path, dev=True), clock=lambda: NOW)
    immutable = {p.name for p in app.processes() if keeps_states_immutable(p)}
    assert immutable == {p.name for p in app.projections()}
    assert "invocations" not in immutable
