"""``callgate demo``: the walk-through of the contract (benchmarks and the chaos run are
developers' tools outside the product: ``make bench``, ``make chaos``; ADR 0025)."""

from __future__ import annotations

import argparse
import sys

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import Context


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    dm = add_command(sub, common, "demo", "walk through the contract end to end", demo)
    dm.add_argument("--keep", action="store_true", help="keep the demo's state directory")


def demo(ctx: Context) -> int:
    from callgate.surfaces.commands.serve import DEV_MODE_NOTICE
    from callgate.surfaces.demo import run_demo

    ctx.needs_kafka_servers()
    print(DEV_MODE_NOTICE, file=sys.stderr, flush=True)  # the demo always runs in it

    return run_demo(ctx.app.settings, ctx.out, keep=ctx.ns.keep)
