"""``python -m tools bench``: one table of figures, with machine details, measured in one run.

Sections (issue "Performance"): first the agent's path (``bench_agent``: the same MCP tool
call direct and through ``callgate mcp --http``, and through the HTTP API, on the embedded
backend and on an Apache Kafka broker of its own); on Apache Kafka (``--broker``), the
ceiling (same topology, no logic) and pipeline throughput with its ratio, latency at fixed
offered loads and per hop; replay; policy CPU time;
embedded durable throughput; start-up (``callgate --help`` and ``callgate propose`` as new
processes, ``bench_startup``); decider memory with many keys; what tracing costs (off and
on in one run, ``bench_tracing``). ``--only history`` (not in
the default set, it fills a log) measures one ``propose`` against an empty log and one with
100,000 settled invocations (``bench_history``). ``--quick`` runs tiny counts (the test
suite's smoke run); figures from it mean nothing.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from callgate.bootstrap import Settings
from callgate.surfaces.render import Renderer
from tools.bench_core import (
    Row,
    bench_embedded,
    bench_memory,
    bench_policy,
    bench_replay,
    bench_startup,
    machine,
)

FULL = {
    "policy": 20_000,
    "embedded": 25_000,  # about 100,000 events: the replay row needs at least that
    "memory": 1_000_000,
    "kafka": 6_000,
    "latency_s": 10.0,
    "history": 100_000,
    "history_samples": 30,
    "simulate": 100_000,
    "freeze_rounds": 5,
    "tracing_calls": 300,
    "tracing_burst": 3_000,
    "agent_calls": 300,
    "agents": 20,
    "startup_samples": 15,
}
QUICK = {
    "policy": 300,
    "embedded": 200,
    "memory": 2_000,
    "kafka": 150,
    "latency_s": 1.5,
    "history": 300,
    "history_samples": 5,
    "simulate": 300,
    "freeze_rounds": 1,
    "tracing_calls": 20,
    "tracing_burst": 100,
    "agent_calls": 5,
    "agents": 2,
    "startup_samples": 3,
}


def run_bench(
    settings: Settings,
    out: Renderer,
    quick: bool = False,
    only: list[str] | None = None,
    plot: Path | None = None,
    broker: str | None = None,
) -> int:
    """Run the sections in ``only`` (default all); ``plot``: where the Kafka section writes
    its latency plot (default ``<state_dir>/latency.png``; docs/latency.png for the docs);
    ``broker``: what the Kafka section runs on (``apache``, the only one)."""
    counts = QUICK if quick else FULL
    wanted = set(
        only
        or [
            "agent",
            "kafka",
            "policy",
            "embedded",
            "replay",
            "startup",
            "memory",
            "simulate",
            "tracing",
        ]
    )
    rows: list[Row] = []

    def section(name: str, fn: Callable[[], list[Row]]) -> None:
        if name not in wanted:
            return
        if not out.json_mode:
            out.err.print(f"[dim]bench: {name}…[/]")
        try:
            rows.extend(fn())
        except Exception as e:  # a failed section is reported, never hidden
            rows.append(Row(f"{name}: FAILED", f"{type(e).__name__}: {e}", ok=False))

    agent_plot = (plot or settings.state_dir / "latency.png").with_name("agent-latency.png")
    swept: dict[str, Any] = {}
    section("agent", lambda: _agent(counts, "embedded", swept, quick))
    section("agent", lambda: _agent(counts, "kafka", swept, quick))  # its own FAILED row
    if swept:
        from tools.bench_agent import plot_sweep

        where = plot_sweep(swept, agent_plot)
        rows.append(Row("agent: latency against offered load", where, note="direct and through"))
    section("kafka", lambda: _kafka(settings, counts, plot, broker))
    section("policy", lambda: bench_policy(int(counts["policy"])))
    embedded_state = None

    def embedded() -> list[Row]:
        nonlocal embedded_state
        found, embedded_state = bench_embedded(int(counts["embedded"]))
        return found

    section("embedded", embedded)
    if embedded_state is not None:
        state = embedded_state
        section("replay", lambda: bench_replay(state))
        shutil.rmtree(state, ignore_errors=True)
    section("startup", lambda: bench_startup(int(counts["startup_samples"])))
    section("memory", lambda: bench_memory(int(counts["memory"])))
    section("history", lambda: _history(settings, counts))
    section("simulate", lambda: _simulate(counts))
    section("freeze", lambda: _freeze(counts))
    section("tracing", lambda: _tracing(counts))

    info = machine() | {"quick": quick}
    report: dict[str, Any] = {
        "machine": info,
        "rows": [r.__dict__ for r in rows],
        "ok": all(r.ok is not False for r in rows),
    }

    def human(c: Any) -> None:
        c.print(bench_table(info, rows, quick))

    out.value(report, human)
    return 0


def bench_table(info: dict[str, Any], rows: list[Row], quick: bool) -> Table:
    """The report as one table: each cell folds to fit a terminal, and is printed whole into
    a pipe or a file (``callgate.surfaces.render.console``)."""
    t = Table(
        title=f"callgate bench — {info['date']} — {info['cpu']} ({info['cores']} cores, "
        f"{info['memory']}), Python {info['python']}"
        + (" — QUICK (figures meaningless)" if quick else "")
    )
    for col in ("measure", "value", "target", "met", "note"):
        t.add_column(col, overflow="fold")
    for r in rows:
        met = "" if r.ok is None else ("[green]yes[/]" if r.ok else "[red]no[/]")
        t.add_row(r.measure, r.value, r.target, met, r.note)
    return t


def _agent(counts: dict[str, float], backend: str, swept: dict[str, Any], quick: bool) -> list[Row]:
    """The agent's path on ``backend``; on Kafka, on an Apache Kafka broker started for it
    (stopped before the Kafka section starts its own). Not ``quick``: also the MCP path at
    offered loads (``bench_agent.SWEEP_RATES``), kept in ``swept`` for the plot."""
    from tools.apache_kafka import ApacheKafka
    from tools.bench_agent import SWEEP_RATES, agent_rows

    calls, agents = int(counts["agent_calls"]), int(counts["agents"])
    rates = () if quick else SWEEP_RATES
    if backend == "embedded":
        return agent_rows("embedded", calls, agents, swept=swept, rates=rates)
    with ApacheKafka() as broker:
        return agent_rows("kafka", calls, agents, broker.bootstrap, swept=swept, rates=rates)


def _simulate(counts: dict[str, float]) -> list[Row]:
    from tools.bench_simulate import bench_simulate

    return bench_simulate(int(counts["simulate"]))


def _freeze(counts: dict[str, float]) -> list[Row]:
    from tools.bench_freeze import bench_freeze

    return bench_freeze(int(counts["freeze_rounds"]))


def _tracing(counts: dict[str, float]) -> list[Row]:
    from tools.bench_tracing import bench_tracing

    return bench_tracing(int(counts["tracing_calls"]), int(counts["tracing_burst"]))


def _history(settings: Settings, counts: dict[str, float]) -> list[Row]:
    from tools.bench_history import bench_history

    return bench_history(settings, int(counts["history"]), int(counts["history_samples"]))


def _kafka(
    settings: Settings, counts: dict[str, float], plot: Path | None, broker: str | None
) -> list[Row]:
    from tools.bench_kafka import bench_kafka

    return bench_kafka(settings, int(counts["kafka"]), float(counts["latency_s"]), plot, broker)
