"""ADR 0068: the compiled check (jsonschema-rs) and the Python validator (jsonschema) that
explains its refusals agree on every shipped catalog schema, for generated arguments."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import jsonschema_rs
from hypothesis import given, settings
from hypothesis import strategies as st

from callgate.adapters.profiles import load_profile
from callgate.domain.catalog import default_profile_path

SCHEMAS = [spec.args_schema for spec in load_profile(default_profile_path()).tools.values()]
NAMES = [*sorted({n for s in SCHEMAS for n in s.get("properties") or {}}), "extra"]
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**12), 10**12) | st.text(max_size=12)
    | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(["ORD-1", "EUR", "T-1"]),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)  # fmt: skip


@settings(max_examples=400)
@given(st.sampled_from(range(len(SCHEMAS))), st.dictionaries(st.sampled_from(NAMES), VALUES))
def test_both_validators_agree(which: int, args: dict[str, Any]) -> None:
    schema = SCHEMAS[which]
    expected = jsonschema.Draft202012Validator(schema).is_valid(args)
    assert jsonschema_rs.Draft202012Validator(schema).is_valid(args) == expected, (
        json.dumps(schema),
        args,
    )
