"""The fast replay (issue 6) computes exactly what the straightforward one does.

- ``canonical_json``'s fast path writes the same text as the reference path (C8, C11);
- a projection called only for the classes in ``reacts_to`` misses nothing (C9);
- the status projection's field-wise comparison equals comparing canonical texts;
- folding shards of a log by partition key and merging by log position gives the views of
  one fold over the whole log, also on a real embedded store with poison, misplaced rows,
  rows filed under another key and one invocation id in two partitions.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_projections import WORD, payload_fields

import callgate.domain.canonical as canonical
from callgate.adapters.avro_codec import AvroCodec, MalformedEvent
from callgate.adapters.embedded.store import EmbeddedStore
from callgate.application.replay import Table, _Unshardable, fold, merge, rebuild, rebuild_sharded
from callgate.domain.canonical import canonical_json, canonical_json_reference, is_plain, plain_json
from callgate.domain.codes import Code
from callgate.domain.events import (
    EVENT_TYPES,
    Event,
    ExecutionStarted,
    PolicyDecided,
    ToolCallProposed,
)
from callgate.domain.process_port import Process, ViewRecord
from callgate_projections import LOG_EVENTS, Projection
from callgate_projections.audit import AuditProjection, AuditState, verify_chain
from callgate_projections.decisions import DecisionsProjection
from callgate_projections.pending import PendingProjection
from callgate_projections.status import StatusProjection, _content, _same_content
from callgate_projections.usage import UsageProjection

CODEC = AvroCodec.default()
PROJECTIONS: list[Projection[Any]] = [
    StatusProjection(),
    PendingProjection(),
    AuditProjection(),
    DecisionsProjection(),
    UsageProjection(),
]

# --- canonical JSON ---------------------------------------------------------------------

# Keys whose UTF-16 order differs from code-point order (U+1F600 vs U+FB33) come up often.
_text = st.text(st.sampled_from('a\u00e9\ufb33\U0001f600"\x00'), max_size=3) | st.text(
    st.characters(codec="utf-8"), max_size=4
)
_leaves = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
json_like = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(_text, inner, max_size=4)
        | st.dictionaries(_text, inner, max_size=2).map(MappingProxyType)
    ),
    max_leaves=16,
)


@settings(max_examples=400)
@given(json_like)
def test_c11_fast_canonical_text_is_the_reference_text(value: Any) -> None:
    assert canonical_json(value) == canonical_json_reference(value)


@given(st.dictionaries(st.text(st.sampled_from("a\ufb33\U0001f600"), max_size=2), _leaves))
def test_c11_keys_order_by_utf16_code_units_on_the_fast_path_too(value: dict[str, Any]) -> None:
    assert canonical_json(value) == canonical_json_reference(value)


@pytest.mark.parametrize(
    "value",
    [
        {"a": 1.0, "b": -0.0},  # integral floats are written as ints
        {"\U0001f600": 1, "\ufb33": 2},  # UTF-16 order differs from code-point order
        {"k": [True, 1, 2**64, -(2**63) - 1, "x\u2028\x7f\x00"]},  # beyond orjson's ints
        {"\ud800": "lone surrogate"},
        {Code.EXECUTED: 1, "a": 2},  # a str subclass (an enum) as a key
        [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
    ],
)
def test_c11_edge_values_take_the_reference_path(value: Any) -> None:
    assert canonical_json(value) == canonical_json_reference(value)


def test_c11_plain_encoder_escapes_every_code_point_like_the_standard_library() -> None:
    """``_sorted_dumps`` (orjson when installed) against ``json`` for all of Unicode."""
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert canonical._sorted_dumps(every) == canonical._SORTING_ENCODER.encode(every)
    bmp_keys = {chr(c): c for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF}
    assert canonical._sorted_dumps(bmp_keys) == canonical_json_reference(bmp_keys)


@settings(max_examples=300)
@given(json_like)
def test_c11_plain_json_of_a_plain_value_is_the_reference_text(value: Any) -> None:
    if is_plain(value):
        assert plain_json(value) == canonical_json_reference(value)
    if isinstance(value, dict) and all(type(k) is str and k.isascii() for k in value):
        grown = {**value, "seq": 1, "hash": "ab"}  # as the audit chain grows a record
        assert is_plain(grown) == is_plain(value)


@pytest.mark.parametrize("bad", [{"a": float("nan")}, {1: "a"}, {"a": {1, 2}}])
def test_c11_refusals_are_unchanged(bad: object) -> None:
    with pytest.raises((ValueError, TypeError)) as fast:
        canonical_json(bad)
    with pytest.raises(fast.type):
        canonical_json_reference(bad)


def test_c9_an_audit_record_that_is_not_plain_is_still_canonical_and_chained() -> None:
    """A float time (from a hand-built event) makes the record not plain: encoded in full."""
    decided = PolicyDecided(
        event_id="p",
        invocation_id="inv",
        partition_key="pk",
        occurred_at=5.0,  # type: ignore[arg-type]
        actor="alice",
        tenant="acme",
        roles=("support",),
        tool="tickets.read",
        target="T-1",
        args_json="{}",
        args_hash="ah",
        fingerprint="fp",
        idempotency_key=None,
        policy_version="pv",
        decision="deny",
        determining_policies=(),
        mutation=False,
        high_impact=False,
        confirmation="none",
    )
    _, (record, head) = AuditProjection().project(AuditState(), decided)
    assert record.value_json is not None and '"occurred_at":5,' in record.value_json
    value = json.loads(record.value_json)
    assert record.value_json == canonical_json_reference(value)
    assert verify_chain([value], [json.loads(head.value_json or "{}")]).ok


# --- status comparison -------------------------------------------------------------------

_fields = st.sampled_from(["outcome", "result", "settled", "updated_at", "error"])
status_like = st.dictionaries(_fields, json_like, max_size=5)


@settings(max_examples=300)
@given(status_like, status_like, st.booleans())
def test_status_field_wise_comparison_equals_comparing_texts(
    new: dict[str, Any], old: dict[str, Any], share: bool
) -> None:
    if share:  # what ``_evolve`` does: a copy that keeps most fields as the same objects
        new = {**old, **{k: v for k, v in new.items() if k in old}}
    assert _same_content(new, old) == (_content(new) == _content(old))


def _respelled(value: Any, data: st.DataObject) -> Any:
    """``value`` written differently with the same canonical text (ints as floats, tuples
    as lists), or unchanged."""
    kind = type(value)
    if kind is int and abs(value) < 2**53 and data.draw(st.booleans()):
        return float(value)
    if kind in (list, tuple):
        items = [_respelled(v, data) for v in value]
        return tuple(items) if data.draw(st.booleans()) else items
    if kind is dict:
        return {k: _respelled(v, data) for k, v in value.items()}
    return value


@settings(max_examples=200)
@given(status_like, st.data())
def test_status_respelled_values_compare_equal(old: dict[str, Any], data: st.DataObject) -> None:
    new = {k: _respelled(v, data) for k, v in old.items()}
    assert _same_content(new, old) == (_content(new) == _content(old))


def test_status_true_is_not_one_and_one_is_one_point_zero() -> None:
    assert not _same_content({"result": True}, {"result": 1})
    assert _same_content({"result": 1.0}, {"result": 1})
    assert _same_content({"result": {"n": 1}}, {"result": {"n": 1.0}})
    assert _same_content({"result": ("a",)}, {"result": ["a"]})


# --- reacts_to ----------------------------------------------------------------------------

_JSON = st.sampled_from(["", "{}", '{"a":1}', "[1,2.5]", '"x"'])


def any_of(cls: type[Event]) -> st.SearchStrategy[Event]:
    """Events of ``cls``, every field drawn, envelopes over two invocations and two keys."""
    return st.builds(
        cls,
        event_id=WORD,
        invocation_id=st.sampled_from(["inv-0", "inv-1"]),
        partition_key=st.sampled_from(["pk-0", "pk-1"]),
        causation_id=WORD,
        occurred_at=st.integers(0, 9),
        **payload_fields(cls, _JSON),
    )


# Everything on the ``events`` topic, plus a request that projections never get.
ANY_EVENT = st.one_of([any_of(c) for c in EVENT_TYPES if c in LOG_EVENTS or c is ToolCallProposed])


@settings(max_examples=150)
@given(st.lists(ANY_EVENT, max_size=12), st.lists(ANY_EVENT, min_size=1, max_size=6))
def test_c9_projections_ignore_every_class_outside_reacts_to(
    log: list[Event], probes: list[Event]
) -> None:
    """The replay skips ``project`` for those classes; this is why that changes nothing."""
    for projection in PROJECTIONS:
        assert projection.reacts_to is None or projection.reacts_to <= LOG_EVENTS
        states: dict[str, Any] = {}
        for event in log:
            state = states.get(event.partition_key, projection.initial_state())
            try:
                states[event.partition_key], _ = projection.project(state, event)
            except Exception:  # a poison event: the runner dead-letters it
                continue
            for probe in probes:
                if projection.reacts_to is None or type(probe) in projection.reacts_to:
                    continue
                here = states.get(probe.partition_key, projection.initial_state())
                after, records = projection.project(here, probe)
                assert after is here and not records, (projection.name, probe)


def test_c9_reacts_to_skips_what_the_bench_log_is_full_of() -> None:
    assert ExecutionStarted not in (StatusProjection.reacts_to or LOG_EVENTS)
    assert ExecutionStarted not in (AuditProjection.reacts_to or LOG_EVENTS)
    assert PolicyDecided in (StatusProjection.reacts_to or ())


# --- shards and merge -----------------------------------------------------------------------


def straightforward(projections: list[Projection[Any]], events: list[Event]) -> dict[str, Any]:
    """The replay before issue 6: every projection, every event, last record wins."""
    states: dict[tuple[str, str], Any] = {}
    tables: dict[str, dict[str, str]] = {}
    for event in events:
        for proj in projections:
            key = (proj.name, event.partition_key)
            state = states.get(key)
            if state is None:
                state = proj.initial_state()
            state, outs = proj.handle(state, event, 0)
            states[key] = state
            for out in outs:
                table = tables.setdefault(out.view, {})
                if out.value_json is None:
                    table.pop(out.key, None)
                else:
                    table[out.key] = out.value_json
    return tables


def _events_only(log: list[Event]) -> list[Event]:
    """Log-topic events, and only those every projection can fold (no poison)."""
    kept: list[Event] = []
    for event in log:
        if type(event) not in LOG_EVENTS:
            continue
        try:
            straightforward(PROJECTIONS, [*kept, event])
        except Exception:  # dropped, as the runner dead-letters it
            continue
        kept.append(event)
    return kept


@settings(max_examples=60, deadline=None)
@given(st.lists(ANY_EVENT, max_size=14), st.integers(1, 3))
def test_sharded_fold_and_merge_equal_one_fold(log: list[Event], shards: int) -> None:
    events = _events_only(log)
    expected = straightforward(PROJECTIONS, events)
    assert rebuild(list(PROJECTIONS), events)[1] == expected
    parts = [
        fold(PROJECTIONS, [e for e in events if int(e.partition_key[-1]) % shards == i])
        for i in range(shards)
    ]
    assert sum(count for count, _ in parts) == len(events)
    try:
        merged = merge(tables for _, tables in parts)
    except _Unshardable:  # one view key written from two shards: order across them matters
        keys = [{(v, k) for v, table in tables.items() for k in table} for _, tables in parts]
        assert any(a & b for i, a in enumerate(keys) for b in keys[i + 1 :])
    else:
        assert merged == expected


def test_merge_drops_tombstones_and_refuses_a_key_written_from_two_shards() -> None:
    first: dict[str, Table] = {"status": {"inv": '{"a":1}', "gone": None}}
    second: dict[str, Table] = {"status": {"other": "{}"}, "audit": {"k": "{}"}}
    assert merge([first, second]) == {
        "status": {"inv": '{"a":1}', "other": "{}"},
        "audit": {"k": "{}"},
    }
    with pytest.raises(_Unshardable):
        merge([first, {"status": {"gone": "{}"}}])


class _Echo:
    """A non-``Projection`` process: replay drives it through ``handle``."""

    name = "echo"
    inputs = frozenset({"events"})
    recovers = False

    def initial_state(self) -> int:
        return 0

    def handle(self, state: int, event: Event, now_ms: int) -> tuple[int, list[ViewRecord]]:
        return state + 1, [ViewRecord("echo", event.partition_key, str(state + 1))]


def test_processes_that_are_not_projections_are_folded_through_handle() -> None:
    events = [dataclasses.replace(_started(), partition_key=pk) for pk in ("a", "b", "a")]
    echo: Process[Any] = _Echo()  # type: ignore[assignment]
    assert rebuild([echo], events) == (3, {"echo": {"a": "2", "b": "1"}})


def _started(inv: str = "inv-1", pk: str = "pk-1") -> ExecutionStarted:
    return ExecutionStarted(
        event_id=f"s-{inv}", invocation_id=inv, partition_key=pk, execution_token="x", attempt=1
    )


# --- a real embedded store -------------------------------------------------------------------


def _read_events(store: EmbeddedStore) -> list[Event]:
    """``EmbeddedBackend.read_events``: what the replay folds."""
    found: list[Event] = []
    for row in store.read_log("events", limit=1_000_000):
        try:
            event = CODEC.decode(row.payload)
        except MalformedEvent:
            continue
        if row.topic == type(event).TOPIC:
            found.append(event)
    return found


def _bench_log() -> Path:
    from tools.bench_core import bench_embedded

    _, state = bench_embedded(40)
    return state


@pytest.fixture(scope="module")
def bench_state() -> Any:
    state = _bench_log()
    yield state
    shutil.rmtree(state, ignore_errors=True)


@pytest.mark.parametrize("shards", [1, 2, 3])
def test_sharded_rebuild_of_an_embedded_log_equals_the_straightforward_one(
    bench_state: Path, shards: int
) -> None:
    store = EmbeddedStore(bench_state, CODEC)
    try:
        events = _events_only(_read_events(store))
        expected = straightforward(PROJECTIONS, events)
        rebuilt = rebuild_sharded(store, CODEC, list(PROJECTIONS), shards)
    finally:
        store.close()
    assert rebuilt.events == len(events) > 100
    assert rebuilt.processes == shards
    tables = rebuilt.views
    assert tables == expected
    assert tables["status"] and tables["audit"] and tables["pending"]


def _hostile_store(path: Path) -> EmbeddedStore:
    """Poison, a request on the events topic, one invocation id in two partitions."""
    store = EmbeddedStore(path, CODEC)
    twins = [
        PolicyDecided(
            event_id=f"p-{pk}",
            invocation_id="twin",
            partition_key=pk,
            occurred_at=at,
            actor="alice",
            tenant="acme",
            roles=("support",),
            tool="tickets.read",
            target=f"T-{at}",
            args_json="{}",
            args_hash="ah",
            fingerprint="fp",
            idempotency_key=None,
            policy_version="pv",
            decision="permit",
            determining_policies=("p0",),
            mutation=False,
            high_impact=False,
            confirmation="none",
        )
        for at, pk in enumerate(["k-0", "k-1", "k-0", "k-1"], 1)  # keys in both shards of 2
    ]
    store.append(twins[:2])
    store.append_raw("events", "k-1", b"\xc3\x01 poison")
    request = ToolCallProposed(
        event_id="r", invocation_id="r", partition_key="k-0", session_token="t", tool="x",
        args_json="{}",
    )  # fmt: skip
    store.append_raw("events", "k-0", CODEC.encode(request))
    store.append(twins[2:])
    store.append([_started("twin", "k-1")])
    return store


def test_one_invocation_in_two_partitions_keeps_the_last_write_of_the_log(
    tmp_path: Path,
) -> None:
    """Two shards wrote view key ``twin``: the log is folded again in one process."""
    store = _hostile_store(tmp_path)
    try:
        events = _read_events(store)
        expected = straightforward(PROJECTIONS, events)
        rebuilt = rebuild_sharded(store, CODEC, list(PROJECTIONS), 2)
    finally:
        store.close()
    assert rebuilt.events == len(events) == 5 and rebuilt.processes == 1
    tables = rebuilt.views
    assert tables == expected
    assert json.loads(tables["status"]["twin"])["target"] == "T-4"


def test_a_row_filed_under_another_key_falls_back_to_one_process(tmp_path: Path) -> None:
    store = _hostile_store(tmp_path)
    try:
        moved = dataclasses.replace(_started("twin", "k-0"), event_id="moved")
        store.append_raw("events", "k-1", CODEC.encode(moved))  # filed under k-1, says k-0
        events = _read_events(store)
        expected = straightforward(PROJECTIONS, events)
        rebuilt = rebuild_sharded(store, CODEC, list(PROJECTIONS), 2)
        assert (rebuilt.events, rebuilt.views, rebuilt.processes) == (len(events), expected, 1)
    finally:
        store.close()
