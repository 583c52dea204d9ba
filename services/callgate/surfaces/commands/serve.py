"""``callgate serve``: run every decider and projection (the main job)."""

from __future__ import annotations

import argparse
import os
import sys
import threading

from callgate.surfaces.commands import Subcommands, add_command
from callgate.surfaces.commands.context import EXIT_OK, Context, Misuse


def register(sub: Subcommands, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    s = add_command(sub, common, "serve", "run all deciders and projections (the main job)", serve)
    s.set_defaults(until_stopped=lambda ns: True)
    s.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only these processes (Kafka backend; default: all)",
    )
    s.add_argument(
        "--http",
        nargs="?",
        const="127.0.0.1:8787",
        metavar="HOST:PORT",
        help="also serve the HTTP API and the approval console (default 127.0.0.1:8787)",
    )
    s.add_argument(
        "--instance-id",
        default=argparse.SUPPRESS,
        help="this instance among those sharing the partitions (Kafka backend; default: "
        "CALLGATE_INSTANCE_ID, else the host name)",
    )


DEV_MODE_NOTICE = (
    "callgate: development mode: development session tokens (callgate session issue) are"
    " trusted; never use it in production"
)
NO_ISSUER_WARNING = (
    "callgate: warning: no session issuer is configured ([[sessions.issuers]] in"
    " callgate.toml) and development mode is off: every session token will be refused"
)


def _notice(ctx: Context, text: str) -> None:
    """One line on stderr for a person; ``--log-format json`` keeps serve's stream to its
    documented events (started, settled, stopped), so the notice is text only."""
    if ctx.ns.log_format != "json":
        print(text, file=sys.stderr, flush=True)


def _watch_pins(ctx: Context, stop: threading.Event) -> None:
    """The pinning watcher beside the runners (ADR 0066): its own client on the backend,
    made in its thread once serve holds the runner."""
    from functools import cache

    from callgate.application import pinning

    gateway = cache(ctx.gateway)  # made on the watcher's thread, at its first check
    app = ctx.app
    pinning.watch(
        app.providers,
        lambda: gateway().record_definitions(),
        app.settings.pinning.check_interval_s,
        stop,
    )


def serve(ctx: Context) -> int:
    ctx.needs_kafka_servers()
    app = ctx.app
    from callgate.surfaces.commands.mcp import check_providers

    check_providers(app)
    if app.settings.dev:
        _notice(ctx, DEV_MODE_NOTICE)
    elif not app.settings.sessions.issuers:
        _notice(ctx, NO_ISSUER_WARNING)
    stop = ctx.stop  # set on SIGTERM or SIGINT (the command line's handlers)
    _watch_pins(ctx, stop)
    if ctx.ns.http is not None:
        from callgate.surfaces.http.context import HttpOptions  # FastAPI only on this path
        from callgate.surfaces.http.server import serve_http

        try:
            options = HttpOptions.from_env(ctx.ns.http)
        except ValueError as e:  # pydantic's ValidationError is one too
            raise Misuse(f"--http {ctx.ns.http}: {e}") from None
        return serve_http(app, options, stop, ctx.out, only=ctx.ns.only)
    if app.settings.backend == "kafka":
        from callgate.adapters.kafka.serve import serve_kafka

        return serve_kafka(app, stop, ctx.ns.only, ctx.ns.log_format, ctx.ns.verbose)
    from callgate.adapters.avro_codec import AvroCodec
    from callgate.adapters.embedded.store import EmbeddedStore
    from callgate.domain.codes import Code, Rejection
    from callgate.logs import SettledLog, StorageLog, serve_line

    codec = AvroCodec.default()
    store = EmbeddedStore(app.settings.state_dir, codec)
    settled = SettledLog(ctx.ns.log_format)
    runner = app.embedded_runner(store, codec, on_views=settled)
    if not runner.acquire(timeout=5.0):
        store.close()
        lock = app.settings.state_dir / "runner.lock"
        raise Rejection(Code.BUSY, f"another callgate serve holds {lock}")
    ctx.out.serving(app.settings.state_dir.resolve(), pid=os.getpid(), dev=app.settings.dev)
    try:
        runner.serve(stop, storage=StorageLog(ctx.ns.log_format))
    finally:
        runner.release()
        store.close()
        serve_line(
            ctx.ns.log_format,
            "stopped",
            f"callgate serve stopped ({settled.count} decisions settled)",
            settled=settled.count,
        )
    return EXIT_OK
