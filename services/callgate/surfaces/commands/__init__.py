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
    "demo",
    "freeze",
    "limits",
)

# The sub-commands each module registers (a unit test keeps it equal to what ``register``
# adds): the command line builds only the parser of the command it was given, and every
# parser only for ``callgate --help`` or a command line it cannot place.
COMMANDS: dict[str, str] = {
    "serve": "serve",
    "session": "session",
    "catalog": "catalog",
    "policy": "policy",
    **dict.fromkeys(("propose", "wait", "pending", "approve", "deny", "status"), "calls"),
    **dict.fromkeys(("audit", "replay", "effects"), "records"),
    **dict.fromkeys(("config", "keys"), "config"),
    "mcp": "mcp",
    "demo": "demo",
    **dict.fromkeys(("freeze", "unfreeze"), "freeze"),
    **dict.fromkeys(("usage", "limits"), "limits"),
}

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
