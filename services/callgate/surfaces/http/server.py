"""``callgate serve --http HOST:PORT``: the service and its HTTP surface in one process.

Embedded: the runner works in a thread (it holds the state directory's runner lock, so
CLI clients append requests and wait for the views, as with a plain ``serve``). Kafka:
the supervisor's children do the work, and a thread tails the view topics into memory
(``LiveKafkaBackend``). Either way uvicorn serves the API in the main thread; a signal
or a failed runner stops both.

The surface has an ``App`` of its own (same settings): its session verifier's cache is
not shared with the runner's decider.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from callgate.application.answers import final_answer
from callgate.application.client import Gateway
from callgate.application.ports import Backend
from callgate.bootstrap import App
from callgate.domain.codes import Code
from callgate.logs import SettledLog, StorageLog, serve_line
from callgate.surfaces.http.context import HttpOptions, ServerContext, ServiceStats
from callgate.surfaces.http.feed import PendingFeed
from callgate.surfaces.http.metrics import ApiMetrics, LimitUsageCollector

if TYPE_CHECKING:
    from collections.abc import Sequence

    from prometheus_client.registry import Collector

    from callgate.surfaces.render import Renderer

log = logging.getLogger("callgate.http")


def build_context(
    surface: App,
    backend: Backend,
    stats: ServiceStats,
    options: HttpOptions,
    collectors: Sequence[Collector] = (),
) -> tuple[ServerContext, PendingFeed]:
    gateway = Gateway(surface, backend)
    feed = PendingFeed(backend)

    def final_outcome(invocation_id: str, status: Mapping[str, Any]) -> str | None:
        if not gateway.is_final(status):
            return None
        return str(final_answer(invocation_id, dict(status))["outcome"])

    usage = LimitUsageCollector(lambda: backend.view_items("usage"))
    metrics = ApiMetrics(
        feed, stats, [*collectors, usage], lambda i: backend.view("status", i), final_outcome
    )
    feed.on_closed = metrics.approval_closed
    ctx = ServerContext(
        gateway=gateway,
        options=options,
        stats=stats,
        feed=feed,
        metrics=metrics,
        verifier=surface.session_verifier,
        sign_in=surface.sign_in,
        slack=surface.slack_interactions,
    )
    return ctx, feed


def run_uvicorn(ctx: ServerContext, dev_mode: bool, stop: threading.Event) -> None:
    import uvicorn

    from callgate.surfaces.http.app import asgi

    config = uvicorn.Config(
        asgi(ctx, dev_mode=dev_mode),
        host=ctx.options.host,
        port=ctx.options.port,
        log_level="warning",
        access_log=False,
        server_header=False,
        lifespan="off",
        timeout_graceful_shutdown=3,
    )
    server = uvicorn.Server(config)

    def stop_server() -> None:
        stop.wait()
        server.should_exit = True

    threading.Thread(target=stop_server, name="callgate-http-stop", daemon=True).start()
    try:
        server.run()
    finally:
        stop.set()


def serve_http(
    app: App, options: HttpOptions, stop: threading.Event, out: Renderer, only: Sequence[str] = ()
) -> int:
    # The HTTP server's modules are imported here, before any thread starts: the runner's
    # thread may import the MCP SDK (an MCP upstream's first call), which imports uvicorn
    # too, and two threads importing uvicorn at once can meet its circular import half
    # done ("cannot import name 'Server' from partially initialized module").
    import uvicorn  # noqa: F401

    import callgate.surfaces.http.app  # noqa: F401

    surface = app.again()
    if app.settings.backend == "kafka":
        return _serve_kafka(app, surface, options, stop, out, only)
    return _serve_embedded(app, surface, options, stop, out)


def _announce(out: Renderer, options: HttpOptions, where: str) -> None:
    url = f"http://{options.host}:{options.port}/"
    serve_line(out.log_format, "started", f"callgate serve HTTP on {url} ({where})", url=url)


def _serve_embedded(
    app: App, surface: App, options: HttpOptions, stop: threading.Event, out: Renderer
) -> int:
    from callgate.adapters.avro_codec import AvroCodec
    from callgate.adapters.embedded.stats import EmbeddedStats
    from callgate.adapters.embedded.store import EmbeddedStore

    codec = AvroCodec.default()
    store = EmbeddedStore(app.settings.state_dir, codec)
    settled = SettledLog(out.log_format)
    runner = app.embedded_runner(store, codec, on_views=settled)
    if not runner.acquire(timeout=5.0):
        out.error(
            Code.BUSY, f"another callgate serve holds {app.settings.state_dir / 'runner.lock'}"
        )
        store.close()
        return 1
    failure: list[str] = []

    def work() -> None:
        try:
            runner.serve(stop, storage=StorageLog(out.log_format))
        except Exception as exc:  # fail closed: stop serving rather than answer stale views
            failure.append(f"{type(exc).__name__}: {exc}")
            log.exception("the embedded runner stopped")
            stop.set()

    backend = surface.embedded_backend()
    stats = EmbeddedStats(backend.store, app.processes(), lambda: failure[0] if failure else None)
    ctx, feed = build_context(surface, backend, stats, options, app.provider_metrics.collectors)
    worker = threading.Thread(target=work, name="callgate-runner")
    notifier = surface.notifier(backend)
    ctx.callbacks = notifier.callbacks if notifier is not None else None
    worker.start()
    feed.start()
    if notifier is not None:
        notifier.start()
    _announce(out, options, f"embedded, {app.settings.state_dir.resolve()}")
    try:
        run_uvicorn(ctx, app.settings.dev, stop)
    finally:
        stop.set()
        worker.join()
        feed.stop()
        if notifier is not None:
            notifier.stop()
        runner.release()
        backend.close()
        store.close()
        serve_line(
            out.log_format,
            "stopped",
            f"callgate serve stopped ({settled.count} decisions settled)",
            settled=settled.count,
        )
    return 1 if failure else 0


def _serve_kafka(
    app: App,
    surface: App,
    options: HttpOptions,
    stop: threading.Event,
    out: Renderer,
    only: Sequence[str],
) -> int:
    from callgate.adapters.kafka.live import KafkaStats
    from callgate.adapters.kafka.serve import (
        Supervisor,
        create_topics_when_reachable,
        worker_env,
    )

    if create_topics_when_reachable(app, stop, out.log_format) is None:
        serve_line(out.log_format, "stopped", "callgate serve stopped (no broker was reached)")
        return 0
    names = list(only) or [p.name for p in app.processes()]
    env = worker_env(app.settings, out.log_format)
    sup = Supervisor(app, names, ["--report-settled"], env=env)
    sup.start()

    def supervise() -> None:
        while not stop.wait(0.5):
            sup.check()

    def children() -> str | None:
        down = sorted(name for name, child in sup.children.items() if child.poll() is not None)
        return f"restarting {', '.join(down)}" if down else None

    backend = surface.live_kafka_backend()
    backend.start()
    stats = KafkaStats(backend, app.processes(), children, lambda: dict(sup.stalls))
    ctx, feed = build_context(surface, backend, stats, options, app.provider_metrics.collectors)
    keeper = threading.Thread(target=supervise, name="callgate-supervisor")
    notifier = surface.notifier(backend)
    ctx.callbacks = notifier.callbacks if notifier is not None else None
    keeper.start()
    feed.start()
    if notifier is not None:
        notifier.start()
    _announce(out, options, f"Kafka {app.settings.bootstrap_servers}, {len(names)} processes")
    try:
        run_uvicorn(ctx, app.settings.dev, stop)
    finally:
        stop.set()
        keeper.join()
        feed.stop()
        if notifier is not None:
            notifier.stop()
        sup.stop()
        backend.close()
        serve_line(
            out.log_format,
            "stopped",
            f"callgate serve stopped ({sup.restarts} restarts)",
            restarts=sup.restarts,
        )
    return 0


__all__ = ["build_context", "run_uvicorn", "serve_http"]
