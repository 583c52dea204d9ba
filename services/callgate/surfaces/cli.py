"""The ``callgate`` command line: a stable, public interface (docs/contract.md, "Command line").

This module is the parser and the error handling only; each sub-command lives in
``callgate.surfaces.commands`` and imports what it needs when it runs, so start-up stays
fast. Every reporting command takes ``--json`` and then prints exactly one JSON value on
stdout, errors included (``{"error": {"code", "message"}}``). Exit codes: 0 when the
command did its job (a denied call is a successful command whose outcome is a denial);
1 when the command itself failed (refused approval, timeout, unreachable broker);
2 for misuse (code ``usage``: unknown flag, bad setting, unreadable profile, malformed
JSON arguments). Never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from callgate import logs, stopping
from callgate.domain.codes import Code, Rejection, storage_failure
from callgate.gc_settings import apply_gc_settings
from callgate.surfaces.commands import COMMANDS, MODULES
from callgate.surfaces.commands.context import (
    EXIT_FAILED,
    EXIT_MISUSE,
    Context,
    Misuse,
)
from callgate.surfaces.report import report_error

ENVIRONMENT = """\
environment (the flag wins over the variable):
  CALLGATE_STATE_DIR, CALLGATE_BACKEND, CALLGATE_BOOTSTRAP_SERVERS, CALLGATE_PROFILE,
  CALLGATE_TIMEOUT, CALLGATE_LOG_FORMAT, CALLGATE_VERBOSE  (see the options above)
  CALLGATE_TOPIC_PREFIX   prefix of every Kafka topic (default: callgate)
  CALLGATE_PARTITIONS     partitions of every Kafka topic (default: 6)
  CALLGATE_FAULTS         fault injection of the simulated providers (JSON object)
  CALLGATE_DEV            1: development mode, trusts `session issue` tokens (default: 0)
  CALLGATE_CONFIG         the configuration file (see --config); every key of it is
                          also CALLGATE_<KEY>, nested keys joined by __

state directory, when neither --state-dir nor CALLGATE_STATE_DIR names one: the nearest
directory named .callgate in the current directory or above it, else
$XDG_STATE_HOME/callgate (~/.local/state/callgate).

exit codes: 0 the command did its job (a denied call too), 1 the command failed,
2 misuse (error code "usage")."""


class UsageError(Exception):
    """argparse refused the command line; ``usage`` is the parser's usage line."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.usage = usage


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage())


def _global_options() -> argparse.ArgumentParser:
    """Options every command takes, before or after the sub-command (a value given
    anywhere wins; defaults are applied later, from the environment, in ``Settings``)."""
    g = _Parser(add_help=False)
    add = g.add_argument
    keep = argparse.SUPPRESS
    add(
        "--json",
        action="store_true",
        default=keep,
        help="print exactly one JSON value on stdout, errors too (default: human output)",
    )
    add(
        "--state-dir",
        type=Path,
        default=keep,
        metavar="DIR",
        help="where keys, the event log and views live (env CALLGATE_STATE_DIR; default: "
        "the nearest .callgate upward, else $XDG_STATE_HOME/callgate)",
    )
    add(
        "--backend",
        choices=["embedded", "kafka"],
        default=keep,
        help="embedded (one machine, no broker) or kafka (env CALLGATE_BACKEND; default: embedded)",
    )
    add(
        "--bootstrap-servers",
        default=keep,
        metavar="HOSTS",
        help="Kafka brokers, host:port[,host:port] (env CALLGATE_BOOTSTRAP_SERVERS; "
        "default: none, required with --backend kafka)",
    )
    add(
        "--profile",
        type=Path,
        default=keep,
        metavar="FILE",
        help="the adoption profile, catalog and policy (env CALLGATE_PROFILE; default: "
        "the bundled default profile)",
    )
    add(
        "--config",
        type=Path,
        default=keep,
        metavar="FILE",
        help="the configuration file (env CALLGATE_CONFIG; default: callgate.toml in the "
        "state directory when present; docs/reference/configuration.md)",
    )
    add(
        "--dev",
        action="store_true",
        default=keep,
        help="development mode: trust and issue development session tokens (env "
        "CALLGATE_DEV=1; default: off; never in production)",
    )
    add(
        "--timeout",
        type=float,
        default=keep,
        metavar="SECONDS",
        help="how long a command waits for an answer or a broker (env CALLGATE_TIMEOUT; "
        "default: 30)",
    )
    add(
        "--log-format",
        choices=logs.LOG_FORMATS,
        default=keep,
        help="text or json lines for serve and logs on stderr (env CALLGATE_LOG_FORMAT; "
        "default: text)",
    )
    add(
        "-v",
        "--verbose",
        action="count",
        default=keep,
        help="show library log lines (librdkafka) on stderr; -vv for debug "
        "(env CALLGATE_VERBOSE=1|2; default: off)",
    )
    return g


COMMAND_MODULES = tuple(f"callgate.surfaces.commands.{name}" for name in MODULES)


def build_parser(
    modules: Sequence[str] = COMMAND_MODULES,
    prog: str = "callgate",
    description: str = "Tool-call authorization gateway for AI agents.",
) -> argparse.ArgumentParser:
    """callgate's parser; ``modules`` (each with ``register(sub, common)``) lets the
    repository's developer tools (``python -m tools``) share its global options."""
    common = _global_options()
    parser = _Parser(
        prog=prog,
        description=description,
        epilog=ENVIRONMENT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND"
    )
    for module in modules:
        importlib.import_module(module).register(sub, common)
    return parser


def _parse(parser: Callable[[], argparse.ArgumentParser], args: list[str]) -> argparse.Namespace:
    """The parsed command line. callgate's own parser is first built with the one module
    of the command named on the line (about 10 ms less than all of them); when that parse
    refuses the line (the name was an option's value, or the line is wrong), the whole
    parser parses it again, so what is printed and raised is the whole parser's."""
    module = _module_named(args) if parser is build_parser else None
    if module is not None:
        try:
            return build_parser((module,)).parse_args(args)
        except UsageError:
            pass
    return parser().parse_args(args)


def _module_named(args: list[str]) -> str | None:
    """The module of the first word of ``args`` (before ``--``) that names a command; None
    when a word before it may ask for the main help (``-h``, ``-vh``, ``--he``...), which
    lists every command: that line is the whole parser's."""
    for arg in args:
        if arg == "--":
            return None
        if arg in COMMANDS:
            return f"callgate.surfaces.commands.{COMMANDS[arg]}"
        if arg.startswith("--"):
            if len(arg) > 2 and "--help".startswith(arg.partition("=")[0]):
                return None
        elif arg.startswith("-") and "h" in arg[1:]:
            return None
    return None


def _from_env(ns: argparse.Namespace) -> None:
    """The global options that are not settings (logging), with their variables."""
    if not hasattr(ns, "log_format"):
        value = os.environ.get("CALLGATE_LOG_FORMAT") or "text"
        if value not in logs.LOG_FORMATS:
            raise Misuse(f"CALLGATE_LOG_FORMAT={value!r} is not usable: expected text or json")
        ns.log_format = value
    if not hasattr(ns, "verbose"):
        value = os.environ.get("CALLGATE_VERBOSE") or "0"
        if not value.isdigit():
            raise Misuse(f"CALLGATE_VERBOSE={value!r} is not usable: expected 0, 1 or 2")
        ns.verbose = int(value)


def _never(ns: argparse.Namespace) -> bool:
    return False


def main(
    argv: Sequence[str] | None = None,
    parser: Callable[[], argparse.ArgumentParser] = build_parser,
) -> int:
    apply_gc_settings()
    args = list(sys.argv[1:] if argv is None else argv)
    # Before parsing: a refused command line is reported in the form the caller asked for.
    json_mode = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    try:
        # A stop during parsing waits for the handlers of a command that runs until
        # stopped; any other command gets Python's KeyboardInterrupt when the hold ends.
        with stopping.held():
            ns = _parse(parser, args)
            _from_env(ns)
            ctx = Context(ns)
            if getattr(ns, "until_stopped", _never)(ns):
                stopping.stop_on_signals(ctx.stop)
    except UsageError as e:
        if not json_mode:
            sys.stderr.write(e.usage)
        report_error(Code.USAGE, str(e), json_mode)
        return EXIT_MISUSE
    except Misuse as e:
        report_error(Code.USAGE, str(e), json_mode)
        return EXIT_MISUSE
    except KeyboardInterrupt:
        return 130
    logs.configure(ns.verbose, ns.log_format)
    code = run(ctx)
    if argv is None and getattr(ns, "until_stopped", _never)(ns):
        stopping.exit_within(code)  # the program itself, not a caller of main() in-process
    return code


def run(ctx: Context) -> int:
    """The command's handler; its exit code, or the code of its failure (never a
    traceback); the command's parts closed either way."""
    try:
        code: int = ctx.ns.handler(ctx)
        return code
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last line of defence: a coded message, never a traceback
        code_, message, exit_code = classify(e)
        report_error(code_, message, ctx.json_mode)
        return exit_code
    finally:
        try:
            ctx.close()
        except Exception as e:
            report_error(Code.INTERNAL_ERROR, f"while closing: {type(e).__name__}: {e}", False)


def classify(e: Exception) -> tuple[Code, str, int]:
    """The code, message and exit code a failed command reports."""
    from callgate.bootstrap import SettingsError
    from callgate.domain.catalog import ProfileError

    if isinstance(e, Misuse | SettingsError | ProfileError):
        return Code.USAGE, str(e), EXIT_MISUSE
    if isinstance(e, Rejection):
        return e.code, e.message, EXIT_FAILED
    if isinstance(e, TimeoutError):
        return Code.TIMEOUT, str(e) or "timed out", EXIT_FAILED
    reason = storage_failure(e)
    if reason is not None:  # ADR 0084: the state directory's disk, not a bug
        return Code.STORAGE_UNAVAILABLE, f"the disk refused a write: {reason}", EXIT_FAILED
    return Code.INTERNAL_ERROR, f"{type(e).__name__}: {e}", EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
