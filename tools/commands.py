"""The sub-commands of ``python -m tools``: ``bench``, ``chaos``, ``soak`` and ``disk-full``, with
callgate's global options (``--json``, ``--state-dir``, ``--bootstrap-servers``...)."""

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
    "startup",
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
        help="only this section, repeatable: agent, kafka, policy, embedded, replay, startup, "
        "memory, simulate, tracing, history or freeze (the last two not in the default run; "
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
        "--cluster",
        type=int,
        default=1,
        metavar="NODES",
        help="run on a cluster of that many Apache Kafka nodes (topics with 3 replicas, "
        "min.insync.replicas 2); a broker kill takes the node that leads the most partitions "
        "(default: 1, a single broker)",
    )
    ch.add_argument(
        "--broker-down",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long the broker stays down at each broker kill (default: 5)",
    )

    ch.add_argument(
        "--network",
        action="store_true",
        help="the network campaign instead (ADR 0088): Toxiproxy between the instances and "
        "the broker and an HTTP upstream; latency, bandwidth, blackhole and resets in turn, "
        "and the broker unreachable at start (--kills, --proposals, --broker-kills unused)",
    )
    ch.add_argument(
        "--hold", type=float, default=30.0, metavar="SECONDS", help="--network: each fault"
    )
    ch.add_argument(
        "--blackhole",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="--network: how long a blackhole lasts (default: 30)",
    )
    ch.add_argument(
        "--gap", type=float, default=10.0, metavar="SECONDS", help="--network: between faults"
    )
    ch.add_argument("--rate", type=float, default=12.0, help="--network: flows launched per second")
    ch.add_argument(
        "--short",
        action="store_true",
        help="--network: the start, the broker's latency, blackhole and resets, and the "
        "upstream's blackhole and resets only (the test tier's form)",
    )

    so = add_command(
        sub,
        common,
        "soak",
        "two serve instances on Apache Kafka under a steady load; do the curves stay flat?",
        soak,
    )
    so.add_argument("--seconds", type=float, default=1800.0, help="default: 1800")
    so.add_argument("--rate", type=float, default=50.0, help="proposals a second (default: 50)")
    so.add_argument("--every", type=float, default=20.0, help="seconds between samples (20)")
    so.add_argument("--csv", type=Path, help="write the samples there")
    so.add_argument("--instances", type=int, default=2, help="default: 2")
    so.add_argument("--seed", type=int, default=7, help="default: 7")

    df = add_command(
        sub,
        common,
        "disk-full",
        "the embedded backend on a disk that fills up under load (a tmpfs of its own)",
        disk_full,
    )
    df.add_argument("--proposals", type=int, default=1000, help="default: 1000")
    df.add_argument("--faults", type=int, default=1, help="times the disk fills (default: 1)")
    df.add_argument(
        "--hold", type=float, default=5.0, metavar="SECONDS", help="how long the disk stays full"
    )
    df.add_argument(
        "--fill-at",
        type=float,
        default=0.3,
        metavar="SHARE",
        help="the first fill once this share of the flows is done (default: 0.3); the "
        "others follow evenly up to 0.85",
    )
    df.add_argument("--size", type=int, default=256, metavar="MIB", help="the tmpfs (default 256)")
    df.add_argument("--seed", type=int, default=7, help="default: 7")
    df.add_argument("--keep", action="store_true", help="keep serve's log when all checks hold")


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
    if ns.network:
        from tools.network_faults import run_network

        return run_network(
            ctx.app.settings,
            ctx.out,
            instances=ns.instances,
            seed=ns.seed,
            rate=ns.rate,
            hold_s=ns.hold,
            blackhole_s=ns.blackhole,
            gap_s=ns.gap,
            short=ns.short,
        )
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
        cluster=ns.cluster,
    )


def soak(ctx: Context) -> int:
    from tools.soak import run_soak

    ns = ctx.ns
    return run_soak(
        ctx.app.settings,
        ctx.out,
        seconds=ns.seconds,
        rate=ns.rate,
        every=ns.every,
        csv_path=ns.csv,
        instances=ns.instances,
        seed=ns.seed,
    )


def disk_full(ctx: Context) -> int:
    from tools.disk_full import run_disk_full

    ns = ctx.ns
    return run_disk_full(
        ctx.app.settings,
        ctx.out,
        proposals=ns.proposals,
        faults=ns.faults,
        hold_s=ns.hold,
        fill_at=ns.fill_at,
        size_mb=ns.size,
        seed=ns.seed,
        keep=ns.keep,
    )
