"""What ADR 0089 changed keeps the behaviour it replaced.

- The event classes' shared ``__eq__``, ``__hash__`` and ``__repr__`` give what the
  generated methods of ``@dataclass(frozen=True, slots=True, kw_only=True)`` give, for
  every event class.
- The runner-lock probe says "held" exactly while another open file holds the lock.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

from callgate.adapters.embedded.ownership import LOCK_FILE, held_elsewhere
from callgate.domain import events as ev


def _sample(cls: type[ev.Event], salt: str = "") -> dict[str, Any]:
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(cls)):
        kind = str(f.type)
        if "tuple" in kind:
            values[f.name] = ("a", f"b'\"{salt}")
        elif kind.startswith("int"):
            values[f.name] = 7 + i
        elif kind.startswith("bool"):
            values[f.name] = True
        else:
            values[f.name] = f"v{i}'\"\n{salt}"
    return values


@pytest.mark.parametrize("cls", ev.EVENT_TYPES, ids=lambda c: c.__name__)
def test_event_value_methods_are_the_generated_ones(cls: type[ev.Event]) -> None:
    fields = dataclasses.fields(cls)
    reference = dataclasses.make_dataclass(
        cls.__name__,
        [(f.name, f.type, f) for f in fields],
        frozen=True,
        slots=True,
        kw_only=True,
    )
    reference.__qualname__ = cls.__qualname__
    values = _sample(cls)
    event, same = cls(**values), cls(**values)
    expected = reference(**values)
    assert repr(event) == repr(expected)
    assert hash(event) == hash(expected) == hash(same)
    assert event == same
    assert (event != same) is False
    assert event != cls(**_sample(cls, salt="x"))
    assert event.__eq__(object()) is NotImplemented
    assert {event: 1}[same] == 1
    assert pickle.loads(pickle.dumps(event)) == event
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.event_id = "changed"  # type: ignore[misc]


def test_events_of_two_classes_are_never_equal() -> None:
    a = ev.ApprovalExpired(event_id="e", invocation_id="i", partition_key="p", stage="")
    b = ev.ExecutionUncertain(
        event_id="e", invocation_id="i", partition_key="p", execution_token="", reason=""
    )
    assert a != b


def test_the_lock_probe_sees_another_holder_only(tmp_path: Path) -> None:
    assert not held_elsewhere(tmp_path)  # free: the probe takes and drops it
    assert not held_elsewhere(tmp_path)  # and did not keep it
    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert held_elsewhere(tmp_path)
    finally:
        os.close(fd)
    assert not held_elsewhere(tmp_path)


def test_the_lock_probe_of_a_directory_it_cannot_open_is_no_holder(tmp_path: Path) -> None:
    """The runner then meets the error itself, where it is reported today."""
    assert not held_elsewhere(tmp_path / "missing" / "deeper")
