"""The sub-commands of ``callgate``, one module per group of commands.

Each module has ``register(sub, common)``, which adds its sub-parsers and points each at
its handler (``handler(ctx) -> exit code``). Modules import only ``argparse`` at the top;
a handler imports what its command needs when it runs, so ``callgate --help`` stays fast.
A new surface adds one module here and one name to ``MODULES``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from callgate.surfaces.commands.context import Handler

# In the order ``callgate --help`` lists them.
MODULES: tuple[str, ...] = (
    "serve",
    "session",
    "catalog",
    "policy",
    "calls",
    "records",
    "config",
    "mcp",
    "ops",
    "freeze",
    "limits",
)

Subcommands = argparse._SubParsersAction  # the object ``add_subparsers`` returns


def add_command(
    sub: Subcommands,  # type: ignore[type-arg]
    common: argparse.ArgumentParser,
    name: str,
    help_text: str,
    handler: Handler,
) -> argparse.ArgumentParser:
    """One sub-command that takes the global options too, handled by ``handler``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, parents=[common], help=help_text, description=help_text
    )
    parser.set_defaults(handler=handler)
    return parser
