"""ADR 0066: the digest of an upstream definition and the fold of the pin events."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from callgate.domain import events as ev
from callgate.domain.codes import Code, Rejection
from callgate.domain.pins import PINS_KEY, Pins, definition_digest, evolve

TOOL = {
    "name": "read_note",
    "description": "Read one note.",
    "inputSchema": {"type": "object", "properties": {"note_id": {"type": "string"}}},
    "annotations": {"readOnlyHint": True},
}
A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def pinned(digest: str, n: int = 1) -> ev.Event:
    return ev.ToolPinned(event_id=f"p{n}", invocation_id="pins", partition_key=PINS_KEY,
                         tool="notes.read", digest=digest, reason="r", author="olga",
                         tenant="ops")  # fmt: skip


def changed(pin: str, seen: str, n: int = 2) -> ev.Event:
    return ev.ToolDefinitionChanged(event_id=f"c{n}", invocation_id="pins",
                                    partition_key=PINS_KEY, tool="notes.read",
                                    pinned_digest=pin, seen_digest=seen)  # fmt: skip


@given(st.permutations(list(TOOL.items())), st.text())
def test_the_digest_covers_the_four_fields_and_nothing_else(
    order: list[tuple[str, Any]], extra: str
) -> None:
    """Key order and fields outside the definition (``title``, ``_meta``, ...) do not
    change it; each of the four does."""
    digest = definition_digest(TOOL)
    assert digest.startswith("sha256:") and len(digest) == 71
    assert definition_digest(dict(order) | {"title": extra, "_meta": {"x": extra}}) == digest
    for field in TOOL:
        assert definition_digest({**TOOL, field: "changed"}) != digest
    assert definition_digest({k: v for k, v in TOOL.items() if k != "annotations"}) != digest


def test_a_changed_definition_is_refused_until_pinned_again() -> None:
    pins = Pins()
    pins.check("notes.read", None)  # unpinned: not checked
    pins = evolve(pins, pinned(A))
    pins.check("notes.read", None)
    pins = evolve(pins, changed(A, B))
    with pytest.raises(Rejection) as refused:
        pins.check("notes.read", None)
    assert refused.value.code == Code.TOOL_DEFINITION_CHANGED
    assert A in refused.value.message and B in refused.value.message
    pins = evolve(pins, pinned(B, n=3))  # the operator reviewed and pinned the new one
    pins.check("notes.read", None)
    pins = evolve(pins, changed(B, A, n=4))  # and the upstream went back: refused again
    with pytest.raises(Rejection):
        pins.check("notes.read", None)


def test_the_catalog_pin_counts_until_an_event_pins_the_tool() -> None:
    pins = Pins()
    pins = evolve(pins, changed(A, B))
    with pytest.raises(Rejection):
        pins.check("notes.read", A)  # the catalog's pin, not what is served
    pins.check("notes.read", B)
    pins = evolve(pins, pinned(B, n=3))
    pins.check("notes.read", A)  # the event's pin wins over the file's


@given(
    st.lists(st.tuples(st.booleans(), st.sampled_from([A, B, "absent"])), max_size=12),
    st.sampled_from([None, A, B]),
)
def test_the_tool_is_refused_exactly_when_the_last_seen_definition_is_not_the_pin(
    steps: list[tuple[bool, str]], catalog_pin: str | None
) -> None:
    """Any order of pins and changes: the fold agrees with a model that keeps the last
    pin (else the catalog's) and the last definition seen (a pin counts as seen)."""
    pins, pin, seen = Pins(), catalog_pin, None
    for n, (is_pin, digest) in enumerate(steps):
        if is_pin and digest != "absent":
            pins = evolve(pins, pinned(digest, n))
            pin = seen = digest
        else:
            pins = evolve(pins, changed(pin or A, digest, n))
            seen = digest
    refused = pin is not None and seen is not None and seen != pin
    try:
        pins.check("notes.read", catalog_pin)
    except Rejection as rejection:
        assert refused and rejection.code == Code.TOOL_DEFINITION_CHANGED
    else:
        assert not refused
