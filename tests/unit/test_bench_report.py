"""How the bench's Kafka section reports proposals that did not settle, its plot path, and
which brokers it runs on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.kafka_support import run_tool
from tools.apache_kafka import KafkaUnavailable, find_java, java_major
from tools.bench_core import Row
from tools.bench_kafka import (
    Result,
    _labelled,
    _stuck_at,
    captured_client_logs,
    client_logger,
    kafka_brokers,
    shown,
)

from callgate.adapters.view_codec import ViewCodec
from callgate.domain.canonical import canonical_json


def in_progress(invocation_id: str) -> bytes:
    """A status record as the status view holds it on Kafka (Avro, ADR 0016)."""
    value = {
        "invocation_id": invocation_id, "partition_key": "p", "tool": None, "actor": None,
        "tenant": None, "target": None, "outcome": "allowed", "settled": False, "error": None,
        "result": None, "dry_run": None, "approval": None, "approved_by": None,
        "replay_of": None, "updated_at": 0,
    }  # fmt: skip
    return ViewCodec.default().encode("status", canonical_json(value))


def test_unsettled_proposals_are_counted_with_where_they_stopped() -> None:
    result = Result(
        2.0,
        [5.0, 7.0],
        {
            "a": _stuck_at(in_progress("a")),
            "b": _stuck_at(in_progress("b")),
            "c": _stuck_at(None),
        },
    )
    note = result.settled_note()
    assert note.startswith("3 of 5 did not settle")
    assert "2 x last status 'allowed', settled=False" in note
    assert "1 x no status record" in note
    assert result.rate() == 1.0  # settled ones only


def test_all_settled_and_no_latency_at_all_do_not_raise() -> None:
    assert Result(1.0, [1.0]).settled_note() == "all settled"
    empty = Result(0.0, [], {"a": _stuck_at(None)})
    assert empty.rate() == 0.0
    assert empty.pcts() == "nan / nan / nan ms"


def test_the_plot_path_is_printed_relative_or_by_name_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert shown(tmp_path / "docs" / "latency.png") == "docs/latency.png"
    elsewhere = shown(tmp_path.parent / "latency.png")
    assert elsewhere.startswith("latency.png") and str(tmp_path.parent) not in elsewhere


def test_client_log_lines_go_to_the_capture_not_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with captured_client_logs() as captured:
        client_logger().error("FAIL|rdkafka#producer-1| Connect failed")
    assert captured.count == 1 and "Connect failed" in captured.last[0]
    assert capsys.readouterr().err == ""
    assert client_logger().propagate is False


def test_rows_name_their_broker() -> None:
    rows = _labelled([Row("kafka pipeline / ceiling", "50%", "≥ 70%", False, "n")], "apache")
    assert rows == [Row("kafka (apache) pipeline / ceiling", "50%", "≥ 70%", False, "n")]


def test_the_kafka_section_runs_on_apache_kafka() -> None:
    assert kafka_brokers("apache") == (["apache"], "--broker apache")
    assert kafka_brokers(None)[0] == ["apache"]


def test_the_java_release_is_read_from_the_runtime_itself() -> None:
    try:
        java = find_java()
    except KafkaUnavailable as exc:
        pytest.skip(f"no Java runtime here: {exc}")
    major = java_major(java)
    assert major is not None and major >= 8


def test_an_unknown_bench_section_is_a_usage_error(tmp_path: Path) -> None:
    """``python -m tools bench --only embeded``: refused (never an empty table)."""
    run = run_tool(tmp_path, "bench", "--only", "embeded", timeout=60)
    assert run.returncode == 2, run
    assert json.loads(run.stdout)["error"]["code"] == "usage"
    assert run.stderr == ""
