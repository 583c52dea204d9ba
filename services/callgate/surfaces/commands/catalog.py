"""``callgate catalog``: the tools with their flags and argument schemas."""

from __future__ import annotations

import argparse

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_OK, Context


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    add_command(sub, common, "catalog", "the tools with their flags and argument schemas", show)


def show(ctx: Context) -> int:
    profile = ctx.app.profile
    ctx.out.catalog(profile.catalog_view(), profile.digest)
    return EXIT_OK
