"""``callgate config check`` and ``callgate keys generate`` (docs/reference/configuration.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_FAILED, EXIT_OK, Context, Misuse


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    config = sub.add_parser(
        "config", parents=[common], help="the configuration (callgate.toml)", description=__doc__
    )
    config_sub = config.add_subparsers(
        dest="config_command", required=True, parser_class=type(config)
    )
    add_command(
        config_sub,
        common,
        "check",
        "validate it and print the effective configuration, secrets redacted",
        check,
    )
    keys = sub.add_parser(
        "keys", parents=[common], help="key pairs for issuers and approvals", description=__doc__
    )
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, parser_class=type(keys))
    gen = add_command(keys_sub, common, "generate", "write a key pair and a JWKS", generate)
    gen.add_argument("--kind", choices=["session", "approval"], required=True)
    gen.add_argument("--alg", choices=["EdDSA", "ES256", "RS256"], default="EdDSA")
    gen.add_argument("--kid", required=True, help="key id (also the file name)")
    gen.add_argument("--out", type=Path, required=True, help="directory to write into")


def check(ctx: Context) -> int:
    from callgate.surfaces.config_view import effective_configuration

    ctx.needs_kafka_servers()
    view = effective_configuration(ctx.app)
    ctx.out.value(view, human=lambda console: console.print_json(data=view))
    return EXIT_OK


def generate(ctx: Context) -> int:
    """Needs no configuration: it writes the files one names."""
    from callgate.domain.codes import Code
    from callgate.domain.keysets import generate_key_pair
    from callgate.surfaces.commands.context import report_error

    ns = ctx.ns
    try:
        made = generate_key_pair(ns.out, ns.kind, ns.alg, ns.kid)
    except (ValueError, FileExistsError) as e:
        raise Misuse(str(e)) from None
    except OSError as e:
        report_error(Code.INTERNAL_ERROR, f"cannot write keys into {ns.out}: {e}", ctx.json_mode)
        return EXIT_FAILED
    result = {
        "kind": made.kind,
        "kid": made.kid,
        "alg": made.alg,
        "private_key": str(made.private_key),
        "public_key": str(made.public_key),
        "jwks": str(made.jwks),
        "jwks_kids": list(made.jwks_kids),
    }
    ctx.out.value(result, human=lambda console: console.print_json(data=result))
    return EXIT_OK
