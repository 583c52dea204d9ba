"""Argument normalization (C7: validated before the ACL; C8/C11: one normalized form)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from callgate.adapters.profiles import load_profile
from callgate.domain.arguments import normalize_args, target_of
from callgate.domain.canonical import args_hash
from callgate.domain.catalog import EntryLimits, Profile, ToolSpec, default_profile_path
from callgate.domain.codes import Code, Rejection

PROFILE: Profile = load_profile(default_profile_path())
LIMITS = PROFILE.entry_limits


def tool(name: str) -> ToolSpec:
    spec = PROFILE.tool(name)
    assert spec is not None
    return spec


def rejected(spec: ToolSpec, args_json: str, limits: EntryLimits = LIMITS) -> Rejection:
    with pytest.raises(Rejection) as err:
        normalize_args(spec, limits, args_json)
    assert err.value.code is Code.INVALID_ARGUMENTS
    return err.value


def test_c8_schema_defaults_fill_missing_arguments() -> None:
    args = normalize_args(tool("tickets.create"), LIMITS, '{"title": "t", "requester_id": "u1"}')
    assert args == {"title": "t", "requester_id": "u1", "body": "", "priority": "normal"}
    given_value = '{"title": "t", "requester_id": "u1", "priority": "high"}'
    assert normalize_args(tool("tickets.create"), LIMITS, given_value)["priority"] == "high"


def test_c8_nested_object_defaults_are_filled() -> None:
    spec = ToolSpec(
        name="x.nested",
        provider="records",
        target_arg=None,
        approvers=("boss",),
        args_schema={
            "type": "object",
            "properties": {
                "opts": {
                    "type": "object",
                    "properties": {"dry": {"type": "boolean", "default": True}},
                },
                "tags": {"type": "array", "default": []},
            },
        },
    )
    assert normalize_args(spec, LIMITS, '{"opts": {}}') == {"opts": {"dry": True}, "tags": []}
    first = normalize_args(spec, LIMITS, "{}")
    first["tags"].append("mutated")
    assert normalize_args(spec, LIMITS, "{}")["tags"] == []  # defaults are copied, not shared


def test_c8_integral_floats_normalize_to_ints() -> None:
    spec = tool("refunds.issue")
    a = normalize_args(spec, LIMITS, '{"order_id":"ORD-1","amount_cents":10000.0,"currency":"EUR"}')
    b = normalize_args(spec, LIMITS, '{"currency":"EUR","amount_cents":10000,"order_id":"ORD-1"}')
    assert a == b and type(a["amount_cents"]) is int
    assert args_hash(a) == args_hash(b)


@given(
    st.sampled_from(["ORD-1", "ORD-2"]),
    st.integers(min_value=1, max_value=100_000_000),
    st.sampled_from(["EUR", "USD"]),
    st.booleans(),
    st.sampled_from([None, 0, 2]),
)
def test_c11_spelling_of_the_same_arguments_gives_the_same_hash(
    order: str, amount: int, currency: str, reverse: bool, indent: int | None
) -> None:
    value = {"order_id": order, "amount_cents": amount, "currency": currency}
    ordered = dict(reversed(list(value.items()))) if reverse else value
    spec = tool("refunds.issue")
    plain = normalize_args(spec, LIMITS, json.dumps(value))
    respelled = normalize_args(spec, LIMITS, json.dumps(ordered, indent=indent))
    assert args_hash(plain) == args_hash(respelled)


def test_c7_size_limit_is_in_utf8_bytes_of_the_raw_text() -> None:
    spec = tool("records.update")
    limits = EntryLimits(max_args_bytes=60, max_depth=8)
    head = '{"record_id":"REC-1","fields":{"n":"'
    fits = head + "x" * (60 - len(head) - 3) + '"}}'
    assert len(fits.encode()) == 60
    assert normalize_args(spec, limits, fits)["fields"]["n"].startswith("x")
    too_big = head + "é" * ((60 - len(head) - 3) // 2 + 1) + '"}}'  # é is 2 bytes
    assert len(too_big) <= 60 < len(too_big.encode())
    assert "max_args_bytes" in rejected(spec, too_big, limits).message


def test_c7_depth_limit() -> None:
    spec = tool("records.update")
    limits = EntryLimits(max_args_bytes=16384, max_depth=4)

    def nested(levels: int) -> str:  # the top-level object is level 1, `fields` level 2
        inner: Any = 1
        for _ in range(levels - 1):
            inner = {"n": inner}
        return json.dumps({"record_id": "REC-1", "fields": inner})

    assert normalize_args(spec, limits, nested(4))["record_id"] == "REC-1"
    assert "max_depth" in rejected(spec, nested(5), limits).message
    lists = json.dumps({"record_id": "REC-1", "fields": {"a": [[[1]]]}})
    assert "max_depth" in rejected(spec, lists, limits).message


def test_c7_pathological_nesting_is_rejected_not_crashing() -> None:
    assert "max_depth" in rejected(tool("tickets.read"), "[" * 5000 + "]" * 5000).message


@pytest.mark.parametrize(
    ("args_json", "field", "says"),
    [
        ("not json", "", "not valid JSON"),
        ('["ORD-1"]', "", "must be a JSON object"),
        ('{"order_id":"ORD-1","amount_cents":NaN,"currency":"EUR"}', "", "NaN"),
        ('{"order_id":"ORD-1","order_id":"GORD-1","amount_cents":5,"currency":"EUR"}', "order_id",
         "duplicate key"),
        ('{"order_id":"ORD-1","order\\u005fid":"GORD-1","amount_cents":5,"currency":"EUR"}',
         "order_id", "duplicate key"),
        ('{"order_id":"ORD-1","currency":"EUR"}', "amount_cents", "required"),
        ('{"order_id":"ORD-1","amount_cents":0,"currency":"EUR"}', "amount_cents", "minimum"),
        ('{"order_id":"ORD-1","amount_cents":1.5,"currency":"EUR"}', "amount_cents",
         "integer"),
        ('{"order_id":"ORD-1","amount_cents":5,"currency":"euro"}', "currency", "does not match"),
        ('{"order_id":"ORD-1","amount_cents":5,"currency":"EUR","tenant":"globex"}', "tenant",
         "Additional properties"),
        ('{"order_id":"\\ud800","amount_cents":5,"currency":"EUR"}', "order_id", "surrogate"),
    ],
)  # fmt: skip
def test_c7_invalid_arguments_are_rejected_with_the_field(
    args_json: str, field: str, says: str
) -> None:
    err = rejected(tool("refunds.issue"), args_json)
    assert says in err.message
    assert err.details.get("field", "") == field


def test_c7_deploy_environment_is_an_enum() -> None:
    bad = '{"service":"billing","version":"1.2.3","environment":"prod"}'
    assert rejected(tool("deploys.trigger"), bad).details == {"field": "environment"}


def test_c7_target_is_the_target_argument_as_text() -> None:
    assert target_of(tool("refunds.issue"), {"order_id": "ORD-7"}) == "ORD-7"
    assert target_of(tool("tickets.read"), {"ticket_id": 42}) == "42"
    assert target_of(tool("tickets.create"), {"title": "x"}) == ""  # creates a new resource


@pytest.mark.parametrize("value", [None, "", True, ["ORD-1"], {"id": "ORD-1"}])
def test_c7_missing_or_non_scalar_target_fails_closed(value: object) -> None:
    with pytest.raises(Rejection) as err:
        target_of(tool("refunds.issue"), {"order_id": value})
    assert err.value.code is Code.INVALID_ARGUMENTS
