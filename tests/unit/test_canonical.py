"""Canonical JSON and derived keys (C8, C11, docs/contract.md "Shape")."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from callgate.adapters.profiles import load_profile
from callgate.domain.arguments import normalize_args
from callgate.domain.canonical import (
    args_hash,
    canonical_json,
    derive_id,
    execution_token,
    partition_key,
    request_fingerprint,
    sha256_hex,
    state_json,
)
from callgate.domain.catalog import EntryLimits, default_profile_path
from callgate.domain.limits import parse_json

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**62), max_value=2**62)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)
json_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=5)


def _reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(v) for v in value]
    return value


@given(json_objects)
def test_c11_key_order_and_whitespace_do_not_change_canonical_text(value: dict[str, Any]) -> None:
    respelled = json.loads(json.dumps(_reversed_keys(value), indent=3, ensure_ascii=True))
    assert canonical_json(respelled) == canonical_json(value)
    assert args_hash(respelled) == args_hash(value)


@given(json_values)
def test_c11_canonical_text_is_compact_json_that_round_trips(value: Any) -> None:
    text = canonical_json(value)
    assert canonical_json(json.loads(text)) == text


def test_c11_canonical_form_details() -> None:
    assert canonical_json({"b": [1.0, 2.5, -0.0], "a": "é"}) == '{"a":"é","b":[1,2.5,0]}'
    assert canonical_json((True, None)) == "[true,null]"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (5.3e55, "5.3e+55"),
        (1e20, "1e+20"),
        (-(2.0**53), "-9007199254740992.0"),
        (2.0**53 - 1, "9007199254740991"),
        (-(2.0**53 - 1), "-9007199254740991"),
    ],
)
def test_an_integral_float_past_the_exact_integers_stays_a_float_and_reads_back(
    value: float, text: str
) -> None:
    """Found by fuzzing (make fuzz-campaign, target json): ``53e54`` passed the strict
    reader, but its canonical text was the integer ``52999…128``, which the same reader
    refuses (outside ±(2**53 - 1), I-JSON); so the same call made again could not find its
    pending approval (``Gateway.resumable`` normalizes the canonical text). Integral floats
    become integers only within the exact range; the canonical text reads back as itself."""
    assert canonical_json(value) == text
    assert parse_json(text) == value and canonical_json(parse_json(text)) == text
    spec = load_profile(default_profile_path()).tool("records.update")
    assert spec is not None
    args = canonical_json({"record_id": "REC-1", "fields": {"n": value}})
    normalized = normalize_args(spec, EntryLimits(), args)
    assert canonical_json(normalized) == args


def test_c11_keys_sort_by_utf16_code_units_as_in_rfc8785() -> None:
    # RFC 8785 section 3.2.3 sorting example.
    keys = ["\u20ac", "\r", "\ufb33", "1", "\U0001f600", "\u0080", "\u00f6"]
    ordered = list(json.loads(canonical_json(dict.fromkeys(keys, 0))))
    assert ordered == ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {"a": [math.nan]}])
def test_c11_nan_and_infinity_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        canonical_json(bad)


@pytest.mark.parametrize("bad", [{1: "a"}, {"a": {1, 2}}, object()])
def test_c11_non_json_values_are_refused(bad: object) -> None:
    with pytest.raises(TypeError):
        canonical_json(bad)


def test_c11_hashes_are_stable_across_releases() -> None:
    # Pinned values: a change here breaks every stored approval and idempotency record.
    assert sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert args_hash({"b": 1, "a": 2}) == (
        "d3626ac30a87e6f7a6428233b3c68299976865fa5508e4267c5415c76af7a772"
    )
    assert partition_key("acme", "k1", "inv-1") == "k-72ae35c2e521a9206631a9038e85d5e0"


def test_c8_fingerprint_binds_tool_target_and_every_argument() -> None:
    base = request_fingerprint("refunds.issue", "ORD-1", {"amount_cents": 500, "currency": "EUR"})
    assert base == request_fingerprint(
        "refunds.issue", "ORD-1", {"currency": "EUR", "amount_cents": 500.0}
    )
    others = {
        request_fingerprint("refunds.issue", "ORD-1", {"amount_cents": 501, "currency": "EUR"}),
        request_fingerprint("refunds.issue", "ORD-2", {"amount_cents": 500, "currency": "EUR"}),
        request_fingerprint("records.update", "ORD-1", {"amount_cents": 500, "currency": "EUR"}),
    }
    assert base not in others and len(others) == 3


@given(st.text(), st.text(), st.text(), st.text())
def test_shape_one_key_in_one_tenant_lands_on_one_partition(
    tenant: str, key: str, inv_a: str, inv_b: str
) -> None:
    assert partition_key(tenant, key, inv_a) == partition_key(tenant, key, inv_b)
    assert partition_key(tenant, key, inv_a).startswith("k-")


@given(st.text(), st.text(), st.text())
def test_shape_same_key_in_two_tenants_gets_two_partitions(a: str, b: str, key: str) -> None:
    if a != b:
        assert partition_key(a, key, "inv") != partition_key(b, key, "inv")


def test_shape_without_a_key_an_invocation_is_its_own_partition() -> None:
    assert partition_key("acme", None, "inv-9") == "i-inv-9"
    assert partition_key("acme", "", "inv-9") != "i-inv-9"  # an empty key is still a key


def test_c12_execution_token_with_key_survives_a_new_invocation() -> None:
    pk = partition_key("acme", "k1", "inv-1")
    first = execution_token(pk, "fp", "inv-1", "k1")
    assert first == execution_token(pk, "fp", "inv-2", "k1")
    assert first != execution_token(pk, "fp-changed", "inv-1", "k1")
    other_tenant = partition_key("globex", "k1", "inv-1")
    assert first != execution_token(other_tenant, "fp", "inv-1", "k1")


def test_c12_execution_token_without_key_is_per_invocation() -> None:
    pk_a, pk_b = partition_key("acme", None, "inv-1"), partition_key("acme", None, "inv-2")
    token = execution_token(pk_a, "fp", "inv-1", None)
    assert token == execution_token(pk_a, "fp", "inv-1", None)
    assert token != execution_token(pk_b, "fp", "inv-2", None)


def test_derive_id_is_deterministic_and_respects_part_boundaries() -> None:
    assert derive_id("inv-1", "PolicyDecided") == derive_id("inv-1", "PolicyDecided")
    assert len(derive_id("x")) == 32
    assert derive_id("ab", "c") != derive_id("a", "bc")


@given(st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
))  # fmt: skip
def test_state_json_is_sorted_compact_json_that_reads_back_exactly(value: object) -> None:
    """Process states: equal values give equal bytes, and the bytes read back to the value
    (an int beyond 64 bits too: orjson cannot write it, ``json`` does)."""
    data = state_json(value)
    assert json.loads(data) == value
    assert data == state_json(json.loads(data))
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert data.decode() == text


@pytest.mark.parametrize(
    "odd", [datetime.datetime(2026, 1, 1), dataclasses.make_dataclass("D", [])()]
)
def test_state_json_refuses_what_json_refuses(odd: object) -> None:
    """A dataclass or datetime inside a state is a bug: raised, never silently encoded."""
    with pytest.raises(TypeError):
        state_json({"x": odd})
