"""C1: a call is decided by the policies whose action scope can match its tool, exactly as
by the whole set (``PolicyEngine._for_action``): same decision, same determining policies
(ids kept, for policies without ``@id`` too), same evaluation errors. A slice none of whose
policies reads ``context`` is given an empty one, and decides as with the full context."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.test_policy import ACME_TARGETS, ARGS, PROFILE, engine_with, spec

from callgate.domain.policy import PolicyEngine, _Slice
from callgate.domain.principal import Principal

# Scoped and unscoped, annotated and not, one that errors for one tool only, an `in` list.
EXTRA = """
forbid (principal, action == Action::"refunds.issue", resource)
when { context.args.amount_cents > 100000 };
@id("no-deploys-for-viewers")
forbid (principal, action in [Action::"deploys.trigger", Action::"users.delete"], resource)
when { principal.roles.contains("viewer") };
@id("records-typo")
forbid (principal, action == Action::"records.update", resource)
when { principal.departmnt == "x" };
permit (principal, action in [Action::"tickets.read"], resource)
when { principal.roles.contains("auditor") };
@id("everyone-read-limit")
forbid (principal, action, resource)
when { context.mutation && principal.roles.contains("readonly") };
"""
# The same, with the context-reading forbid scoped: the tools it does not name read no
# context, and one that reads it only deep in an expression.
SCOPED_CONTEXT = EXTRA.replace(
    "forbid (principal, action, resource)\nwhen { context.mutation && ",
    'forbid (principal, action == Action::"users.delete", resource)\n'
    'when { (if true then {"a": [context.mutation]} else {"a": []}).a.contains(true) && ',
)
ROLES = ("support", "admin", "finance", "release", "viewer", "auditor", "readonly")
TENANTS = ("acme", "globex", "")


@pytest.fixture(scope="module", params=[EXTRA, SCOPED_CONTEXT], ids=["unscoped", "scoped"])
def sliced(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> PolicyEngine:
    return engine_with(tmp_path_factory.mktemp("slices"), request.param)


def whole(engine: PolicyEngine) -> PolicyEngine:
    """The same engine deciding every tool with the whole set and the full context."""
    twin = PolicyEngine(engine._profile)
    twin._slices = {name: _Slice(twin._policies, True) for name in engine._profile.tools}
    return twin


def test_each_tool_is_decided_by_fewer_policies_than_the_whole_set(sliced: PolicyEngine) -> None:
    total = len(sliced._policies)
    for name in PROFILE.tools:
        assert len(sliced._for_action(name).policies) < total, name
    # Its generated permit, the `in` permit, tenant isolation, and the unscoped forbid that
    # reads context where it is unscoped.
    read = sliced._for_action("tickets.read")
    assert len(read.policies) == (4 if read.reads_context else 3)


def test_only_the_slices_whose_policies_read_context_are_given_one(tmp_path: Path) -> None:
    default = PolicyEngine(PROFILE)
    assert not any(default._for_action(name).reads_context for name in PROFILE.tools)
    scoped = engine_with(tmp_path, SCOPED_CONTEXT)
    reading = {name for name in PROFILE.tools if scoped._for_action(name).reads_context}
    assert reading == {"refunds.issue", "users.delete"}


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    tool=st.sampled_from(sorted(PROFILE.tools)),
    roles=st.lists(st.sampled_from(ROLES), max_size=3, unique=True),
    tenant=st.sampled_from(TENANTS),
    other_target=st.booleans(),
    amount=st.integers(min_value=0, max_value=200_000),
)
def test_a_slice_decides_as_the_whole_set(
    sliced: PolicyEngine,
    tool: str,
    roles: list[str],
    tenant: str,
    other_target: bool,
    amount: int,
) -> None:
    reference = whole(sliced)
    who = Principal("alice", tenant, tuple(sorted(roles)))
    target = "GT-1" if other_target and ACME_TARGETS[tool] else ACME_TARGETS[tool]
    args = dict(ARGS[tool])
    if tool == "refunds.issue":
        args["amount_cents"] = amount
    assert sliced.decide(who, spec(tool), target, args) == reference.decide(
        who, spec(tool), target, args
    )


def test_an_unannotated_policy_is_named_by_its_whole_set_id(sliced: PolicyEngine) -> None:
    """A forbid without ``@id`` is reported as Cedar's id in the whole set, not the slice's."""
    who = Principal("alice", "acme", ("finance",))
    args = dict(ARGS["refunds.issue"], amount_cents=150_000)
    decision = sliced.decide(who, spec("refunds.issue"), "ORD-1", args)
    assert not decision.allowed
    assert decision == whole(sliced).decide(who, spec("refunds.issue"), "ORD-1", args)
    (named,) = decision.determining_policies
    assert named.startswith("policy") and named != "policy0"


def test_an_evaluation_error_in_a_scoped_policy_denies_only_its_tool(
    sliced: PolicyEngine,
) -> None:
    support = Principal("alice", "acme", ("support",))
    update = sliced.decide(support, spec("records.update"), "REC-1", ARGS["records.update"])
    assert not update.allowed and any("departmnt" in e for e in update.errors)
    read = sliced.decide(support, spec("tickets.read"), "T-1", ARGS["tickets.read"])
    assert read.allowed and not read.errors


def test_a_set_with_templates_is_used_whole(tmp_path: Path) -> None:
    engine = engine_with(
        tmp_path, 'permit (principal == ?principal, action == Action::"x", resource);'
    )
    assert engine._for_action("tickets.read") == _Slice(engine._policies, reads_context=True)
