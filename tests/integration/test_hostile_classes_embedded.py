"""The four hostile-input classes (``tests.hostile_scenarios``) on the embedded backend,
through the SDK, plus the command line's limits and tenant-scoped reads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.e2e.helpers import ops, run, session
from tests.hostile_scenarios import (
    cross_tenant_scenario,
    limits_scenario,
    poison_scenario,
    self_approval_scenario,
    spelled_identity_scenario,
    strict_record_scenario,
)

from callgate.adapters.embedded.backend import EmbeddedBackend
from callgate.bootstrap import Settings
from callgate.domain import events as ev
from callgate.surfaces.sdk import Gateway, connect


@pytest.fixture
def embedded_gateway(tmp_path: Path) -> Iterator[Gateway]:
    gateway = connect(Settings(state_dir=tmp_path / "state", dev=True))
    yield gateway
    gateway.close()


def dead_letters(embedded_gateway: Gateway) -> list[ev.EventDeadLettered]:
    backend = embedded_gateway.backend
    assert isinstance(backend, EmbeddedBackend)
    rows = backend.store.read_log("dead-letter")
    decoded = [backend.codec.decode(row.payload) for row in rows]
    return [d for d in decoded if isinstance(d, ev.EventDeadLettered)]


def test_poison_values_get_a_code_and_the_partition_moves_on(embedded_gateway: Gateway) -> None:
    poison_scenario(embedded_gateway, lambda: dead_letters(embedded_gateway))


def test_another_tenant_cannot_overwrite_or_block_an_invocation(embedded_gateway: Gateway) -> None:
    cross_tenant_scenario(embedded_gateway, lambda: dead_letters(embedded_gateway))


def test_the_actor_cannot_approve_their_own_call_under_another_spelling(
    embedded_gateway: Gateway,
) -> None:
    self_approval_scenario(embedded_gateway)


def test_the_sdk_refuses_arguments_over_the_limits_with_a_code(embedded_gateway: Gateway) -> None:
    limits_scenario(embedded_gateway)


HOSTILE_CLI_ARGS = {
    "deep": '{"record_id": "REC-1", "fields": ' + "[" * 5000 + "]" * 5000 + "}",
    "5000-digits": '{"record_id": "REC-1", "fields": {"x": ' + "9" * 5000 + "}}",
    "infinite": '{"record_id": "REC-1", "fields": {"x": 1e400}}',
}


@pytest.mark.parametrize("name", sorted(HOSTILE_CLI_ARGS))
def test_the_command_line_refuses_hostile_args_with_a_code(tmp_path: Path, name: str) -> None:
    """``--args`` that a recursive parser or canonical JSON cannot take: the answer of a
    refused call, ``invalid_arguments`` (exit 0, as a decided refusal), never
    ``internal_error``, and nothing published."""
    state = tmp_path / "state"
    alice = session(state, "alice", "acme", "support")
    argv = ["propose", "--session", alice, "--tool", "records.update"]
    result = run(state, *argv, "--args", HOSTILE_CLI_ARGS[name], rc=0)
    assert result.value["outcome"] == result.value["error"]["code"] == "invalid_arguments"
    assert run(state, "audit", "--session", ops(state)).value == []


def test_command_line_reads_take_a_session_and_show_only_its_tenant(tmp_path: Path) -> None:
    state = tmp_path / "state"
    alice = session(state, "alice", "acme", "support")
    gina = session(state, "gina", "globex", "support")
    refund = '{"order_id": "ORD-1", "amount_cents": 500, "currency": "EUR"}'
    argv = ["propose", "--session", alice, "--tool", "refunds.issue", "--args", refund]
    inv = run(state, *argv).value["invocation_id"]
    assert run(state, "status", inv, "--session", alice).value["tenant"] == "acme"
    run(state, "status", inv, "--session", gina, rc=1)  # not found for another tenant
    run(state, "status", inv, rc=2)  # no session: misuse
    assert [r["invocation_id"] for r in run(state, "pending", "--session", alice).value] == [inv]
    assert run(state, "pending", "--session", gina).value == []
    assert run(state, "audit", "--session", gina).value == []
    assert [r["invocation_id"] for r in run(state, "audit", "--session", alice).value] == [inv]
    assert len(run(state, "audit", "--session", ops(state)).value) == 1  # the operator role


def test_other_spellings_of_tenant_and_role_get_nothing(embedded_gateway: Gateway) -> None:
    spelled_identity_scenario(embedded_gateway)


def test_unreadable_arguments_in_a_record_are_dead_lettered_never_decided(
    embedded_gateway: Gateway,
) -> None:
    strict_record_scenario(embedded_gateway, lambda: dead_letters(embedded_gateway))
