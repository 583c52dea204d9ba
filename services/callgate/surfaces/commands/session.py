"""``callgate session issue``: a signed session token from the development issuer."""

from __future__ import annotations

import argparse

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_OK, Context, Misuse


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    session = sub.add_parser(
        "session", parents=[common], help="development session tokens", description=__doc__
    )
    session_sub = session.add_subparsers(
        dest="session_command", required=True, parser_class=type(session)
    )
    issue = add_command(
        session_sub,
        common,
        "issue",
        'issue a signed session token; prints the token alone (`--json`: {"token"})',
        issue_token,
    )
    issue.add_argument("--user", required=True, help="the acting user (the token's subject)")
    issue.add_argument("--tenant", required=True, help="the user's tenant")
    issue.add_argument("--roles", default="", help="comma-separated roles (default: none)")
    issue.add_argument("--ttl", type=int, default=3600, help="lifetime in seconds (default: 3600)")


def issue_token(ctx: Context) -> int:
    """The token alone on one line, so that ``TOKEN=$(callgate session issue ...)`` works."""
    ns = ctx.ns
    if ns.ttl <= 0:
        raise Misuse("--ttl must be a positive number of seconds")
    roles = [r for r in ns.roles.split(",") if r]
    app = ctx.app
    token = app.session_issuer.issue(ns.user, ns.tenant, roles, app.clock(), ttl_seconds=ns.ttl)
    ctx.out.value({"token": token}, human=lambda _console: ctx.out.plain(token))
    return EXIT_OK
