"""A full disk under the embedded store (issue 42, "A full disk"; ADR 0084).

``test_a_short_campaign_holds_every_check`` runs ``python -m tools --json disk-full`` (the
short form of ``make disk-full``): ``callgate serve --http`` on a tmpfs of its own under
load, the disk filled by a ballast file and given back once, with the command line, the
HTTP API and ``callgate mcp`` asked for calls meanwhile; then the verdict. It needs a
size-limited filesystem: a tmpfs in a mount namespace (root, or unprivileged user
namespaces); elsewhere it is skipped with the reason. The tests below it show that the
campaign's own checks can fail: each is given one planted violation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.kafka_support import run_tool
from tools import small_disk
from tools.disk_full import Fault, fault_violations, unrecorded_answers
from tools.disk_surfaces import SURFACES, Answer

STORAGE = "storage_unavailable"


@pytest.mark.disk
def test_a_short_campaign_holds_every_check(tmp_path: Path) -> None:
    """300 proposals, the disk full once for 3 s: nothing lost, no effect twice, no
    high-impact effect without its approval, every surface answered ``storage_unavailable``
    and nothing else for a call not recorded, no traceback, serve resumed by itself, the
    stores intact, ``audit verify`` and ``replay`` hold; the fault's cost is printed."""
    reason = small_disk.unavailable()
    if reason is not None:
        pytest.skip(f"no size-limited filesystem to fill here: {reason}")
    args = ("disk-full", "--proposals", "300", "--hold", "3", "--size", "128", "--seed", "11")
    run = run_tool(tmp_path, *args, timeout=240)
    report: dict[str, Any] = json.loads(run.stdout)
    figures: dict[str, Any] = report["figures"]
    assert run.returncode == 0, (report["violations"][:20], run.stderr[-3000:])
    assert report["ok"] is True and report["violations"] == []
    assert figures["lost"] == 0 and figures["double effects"] == 0
    assert figures["unapproved high-impact effects"] == 0
    assert figures["audit chain ok"] is True and figures["replay equal"] is True
    assert figures["store integrity ok"] is True and figures["files left half written"] == 0
    assert figures["answers of unrecorded calls"] == 0 and figures["tracebacks"] == 0
    refusals = figures["refusals during the faults, by surface"]
    assert all(refusals[surface] > 0 for surface in SURFACES), refusals
    assert figures["requests refused (sdk), sent again"] > 0
    assert figures["serve logged each refusal and recovery"] is True
    cost = figures["fault cost s, space back -> next call executed (each)"]
    assert cost != "-" and float(cost) < 30, cost
    assert figures["serve stopped cleanly"] is True
    assert figures["elapsed s"] < 120


# --- the checks can fail -------------------------------------------------------------------


def answer(surface: str, code: str, inv: str | None = None, fault: int | None = 0) -> Answer:
    return Answer(surface, code, inv, fault)


def test_a_refusal_and_a_recorded_call_are_answers_a_caller_may_get() -> None:
    answers = [answer("cli", STORAGE), answer("http", "pending_decision", "inv-1")]
    assert unrecorded_answers(answers, {"inv-1": {"settled": True}}) == []


@pytest.mark.parametrize(
    ("code", "inv"),
    [("executed", "inv-2"), ("allowed", None), ("internal_error", None), ("executed", None)],
)
def test_any_other_answer_about_a_call_not_recorded_is_reported(code: str, inv: str | None) -> None:
    found = unrecorded_answers([answer("mcp", code, inv)], {"inv-1": {"settled": True}})
    assert found == [f"mcp: {code}"]


def test_a_fault_that_every_surface_met_and_that_ended_passes() -> None:
    fault = Fault(0.3, filled_at=1.0, back_at=2.0, cost_s=0.5)
    assert fault_violations(0, fault, [answer(s, STORAGE) for s in SURFACES]) == []


def test_a_surface_that_never_met_the_fault_is_reported() -> None:
    fault = Fault(0.3, filled_at=1.0, back_at=2.0, cost_s=0.5)
    met = [answer("cli", STORAGE), answer("http", STORAGE), answer("mcp", "pending_decision")]
    assert fault_violations(0, fault, met) == ["fault 1: mcp answered no storage_unavailable"]


def test_no_call_executed_after_the_space_came_back_is_reported() -> None:
    fault = Fault(0.3, filled_at=1.0, back_at=2.0)
    found = fault_violations(1, fault, [answer(s, STORAGE) for s in SURFACES])
    assert found == ["fault 2: no call was executed after the space came back"]


def test_a_fault_that_never_started_is_reported() -> None:
    found = fault_violations(0, Fault(0.3), [])
    assert found[0] == "fault 1: the disk was never filled while serve had work"
