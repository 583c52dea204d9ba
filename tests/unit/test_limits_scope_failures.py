"""The pure rules of hostile input: limits at every entry (``domain/limits.py``), request
ids bound to sessions (``domain/scope.py``) and failure classification
(``adapters/failures.py``)."""

from __future__ import annotations

import sqlite3

import pytest
from confluent_kafka import KafkaError, KafkaException

from callgate.adapters.avro_codec import MalformedEvent
from callgate.adapters.failures import Deterministic, Transient, answers, classify
from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.codes import Code, Rejection, Unanswerable
from callgate.domain.limits import MAX_SAFE_INTEGER, check_value, parse_args
from callgate.domain.principal import Principal
from callgate.domain.scope import OPERATOR_ROLE, bound_id, is_bound, may_read

REFUSED = {
    "deep": ("[" * 5000 + "]" * 5000, "max_depth"),
    "nine-deep": ('{"a":' * 9 + "1" + "}" * 9, "max_depth"),
    "inf": ('{"x": 1e400}', "number"),
    "ninf": ('{"x": -1e999}', "number"),
    "digits": ('{"x": ' + "9" * 5000 + "}", "number"),
    "beyond-ijson": ('{"x": ' + str(MAX_SAFE_INTEGER + 1) + "}", "number"),
    "precision": ('{"x": 1.000000000000000000001}', "number"),
    "underflow": ('{"x": 1e-400}', "number"),
    "nan": ('{"x": NaN}', "syntax"),
    "duplicate": ('{"x": 1, "x": 2}', "syntax"),
    "escaped-surrogate": ('{"x": "\\ud800"}', "unicode"),
    "raw-surrogate": ('{"x": "\ud800"}', "unicode"),
    "not-an-object": ("[1]", "type"),
    "oversized": ('{"x": "' + "A" * 20_000 + '"}', "max_args_bytes"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_parse_args_refuses_with_the_limit_named(name: str) -> None:
    text, limit = REFUSED[name]
    with pytest.raises(Rejection) as refused:
        parse_args(text)
    assert (refused.value.code, refused.value.details["limit"]) == (Code.INVALID_ARGUMENTS, limit)


def test_parse_args_takes_bytes_and_text_and_keeps_what_is_representable() -> None:
    text = '{"s": "[{\\"", "n": [1, -2.5, 9007199254740991, 0.1], "brackets": "[[[[[[[[["}'
    assert parse_args(text) == parse_args(text.encode())
    assert parse_args(text)["n"] == [1, -2.5, MAX_SAFE_INTEGER, 0.1]
    with pytest.raises(Rejection):
        parse_args(b'{"x": "\xff"}')  # not UTF-8


def test_check_value_refuses_python_values_no_encoder_should_see() -> None:
    deep: dict[str, object] = {}
    for _ in range(10_000):
        deep = {"n": deep}
    for value in (deep, {"x": float("inf")}, {"x": 10**30}, {"x": "\udcff"}, {1: "x"}):
        with pytest.raises(Rejection) as refused:
            check_value(value)
        assert refused.value.code == Code.INVALID_ARGUMENTS
    assert check_value({"a": [1, 2.5, None, True, "é"]}) == '{"a": [1, 2.5, null, true, "é"]}'


def test_request_ids_are_bound_to_one_session_token() -> None:
    inv = bound_id("token-a", "nonce")
    assert is_bound(inv, "token-a")
    assert not is_bound(inv, "token-b") and not is_bound("nonce", "token-a")
    assert not is_bound("." + inv.split(".")[1], "token-a")
    with pytest.raises(ValueError):
        bound_id("token-a", "a.b")


def test_reads_are_the_readers_tenant_unless_operator() -> None:
    alice = Principal("alice", "acme", ("support",))
    ops = Principal("ops", "x", (OPERATOR_ROLE,))
    assert may_read(alice, "acme")
    spellings = ("ACME", "Acme", "acme ", "\uff41\uff43\uff4d\uff45")
    assert not any(may_read(alice, t) for t in spellings)
    assert not may_read(alice, "globex") and not may_read(alice, None)
    assert may_read(ops, "globex") and may_read(ops, None)


def test_a_hostile_routing_claim_hashes_instead_of_raising() -> None:
    assert partition_key("\ud800", "K", "inv").startswith("k-")


@pytest.mark.parametrize(
    "exc",
    [OSError("disk"), TimeoutError(), ConnectionError(), sqlite3.OperationalError("locked"),
     KafkaException(KafkaError(KafkaError._TRANSPORT)), BufferError(), MemoryError()],
)  # fmt: skip
def test_infrastructure_failures_are_transient(exc: BaseException) -> None:
    assert isinstance(classify(exc), Transient)


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ValueError("x"), Code.MALFORMED_EVENT),
        (OverflowError("x"), Code.MALFORMED_EVENT),
        (RecursionError(), Code.MALFORMED_EVENT),
        (KeyError("x"), Code.MALFORMED_EVENT),
        (TypeError("x"), Code.MALFORMED_EVENT),
        (RuntimeError("a bug"), Code.MALFORMED_EVENT),
        (MalformedEvent("bad bytes"), Code.MALFORMED_EVENT),
        (UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogate"), Code.INVALID_ARGUMENTS),
        (Rejection(Code.UNAUTHENTICATED, "x"), Code.UNAUTHENTICATED),
        (Rejection(Code.TOOL_FORBIDDEN, "x"), Code.MALFORMED_EVENT),
    ],
)
def test_input_failures_are_deterministic_with_a_caller_code(exc: Exception, code: Code) -> None:
    failure = classify(exc)
    assert isinstance(failure, Deterministic) and failure.code == code and failure.answer


def test_a_dropped_request_is_answered_once_and_an_unanswerable_one_never() -> None:
    p = ev.ToolCallProposed(
        event_id="e1", invocation_id="i1", partition_key="k", session_token="t", tool="x",
        args_json="{}",
    )  # fmt: skip
    failure = classify(ValueError("boom"))
    assert isinstance(failure, Deterministic)
    (answer,) = answers(p, failure, "decider", 5)
    assert isinstance(answer, ev.ProposalRejected) and answer.code == "malformed_event"
    assert answers(p, failure, "decider", 9)[0].event_id == answer.event_id  # deterministic
    unanswerable = classify(Unanswerable(Code.MALFORMED_EVENT, "not bound"))
    assert isinstance(unanswerable, Deterministic) and answers(p, unanswerable, "d", 5) == []
