"""The sub-commands of ``python -m tools``: ``bench`` and ``chaos``, with callgate's global
options (``--json``, ``--state-dir``, ``--bootstrap-servers``...)."""

from __future__ import annotations

import argparse
from pathlib import Path

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import Context

# The sections of ``bench`` (tools.bench); an unknown name is a usage error.
BENCH_SECTIONS = (
    "agent",
    "kafka",
    "policy",
    "embedded",
    "replay",
    "memory",
    "simulate",
    "history",
    "freeze",
    "tracing",
)


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    be = add_command(sub, common, "bench", "benchmark figures (starts its own test broker)", bench)
    be.add_argument("--quick", action="store_true", help="tiny counts (smoke run)")
    be.add_argument(
        "--only",
        action="append",
        default=[],
        choices=BENCH_SECTIONS,
        help="only this section, repeatable: agent, kafka, policy, embedded, replay, memory, "
        "simulate, tracing, history or freeze (the last two not in the default run; "
        "default: all others)",
    )
    be.add_argument(
        "--plot",
        type=Path,
        metavar="FILE",
        help="where the Kafka section writes its latency plot (default: <state-dir>/latency.png)",
    )
    be.add_argument(
        "--broker",
        choices=["apache"],
        default=None,
        help="what the Kafka section runs on: Apache Kafka from Maven (Java 17; the default)",
    )

    ch = add_command(
        sub, common, "chaos", "chaos run on the Kafka backend (starts its own test broker)", chaos
    )
    ch.add_argument("--proposals", type=int, default=2000, help="default: 2000")
    ch.add_argument("--kills", type=int, default=10, help="workers SIGKILLed (default: 10)")
    ch.add_argument("--seed", type=int, default=7, help="default: 7")
    ch.add_argument(
        "--broker",
        choices=["apache"],
        default="apache",
        help="the broker the run starts unless --bootstrap-servers: Apache Kafka from Maven "
        "(needs Java 17 and mvn)",
    )
    ch.add_argument(
        "--instances",
        type=int,
        default=1,
        help="serve instances; more than 1: each kill takes a whole instance (default: 1)",
    )
    ch.add_argument(
        "--broker-kills",
        type=int,
        default=0,
        help="times the run's own broker is SIGKILLed and started again on its data, beside "
        "the other kills (default: 0)",
    )
    ch.add_argument(
        "--broker-down",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long the broker stays down at each broker kill (default: 5)",
    )


def bench(ctx: Context) -> int:
    from tools.bench import run_bench

    return run_bench(
        ctx.app.settings,
        ctx.out,
        quick=ctx.ns.quick,
        only=ctx.ns.only,
        plot=ctx.ns.plot,
        broker=ctx.ns.broker,
    )


def chaos(ctx: Context) -> int:
    from tools.chaos import run_chaos

    ns = ctx.ns
    return run_chaos(
        ctx.app.settings,
        ctx.out,
        proposals=ns.proposals,
        kills=ns.kills,
        seed=ns.seed,
        broker=ns.broker,
        instances=ns.instances,
        broker_kills=ns.broker_kills,
        broker_down_s=ns.broker_down,
    )
