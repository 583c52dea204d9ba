"""``callgate serve`` on Kafka: create the topics, run every process as a supervised child.

Each process runs in its own OS process (both cores, and one crash takes down one
process). The supervisor restarts a child that dies; the restarted child fences its
previous incarnation (same ``transactional.id``) and restores its state from the
changelog before consuming again.

Many instances (ADR 0015): every ``callgate serve`` against the same topics joins the same
consumer group per process, so N instances share the partitions. Each needs its own
``--instance-id`` (default: the host name): its transactional ids and its state stores hang
off it. A second serve with the same id and state directory is refused (a lock); a child
fenced again and again means another instance elsewhere runs with this id, and serve
stops rather than fence it back in a loop.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException

from callgate.adapters.kafka.client import broker_unavailable, make_admin, probe
from callgate.adapters.kafka.topics import Topics, ensure_topics, replication_for
from callgate.adapters.kafka.worker import LOG_FORMAT_ENV, VERBOSE_ENV, consumer_overrides
from callgate.adapters.wiring import Wiring
from callgate.domain.codes import Code, Rejection
from callgate.domain.process_port import Process
from callgate.logs import serve_line
from callgate.settings import Settings, SettingsError

if TYPE_CHECKING:
    from callgate.logs import LogFormat

RETRY_MAX_S = 30.0  # the longest wait between two attempts to reach the broker


def views_of(app: Wiring) -> dict[str, str]:
    """view name -> the process that writes it."""
    return writers_of(app.projections())


def writers_of(projections: Sequence[Process[Any]]) -> dict[str, str]:
    """view name -> the projection of ``projections`` that writes it."""
    return {view: p.name for p in projections for view in getattr(p, "views", ())}


def refuse_earlier_layout(topics: Topics, existing: set[str]) -> None:
    """Fail closed on a deployment that the three-process layout ran (ADR 0077): a new
    ``invocations`` group would start from the beginning of ``requests`` with none of the
    decider's state (idempotency records, pending approvals) and none of the executor's
    open executions, and decide old proposals again."""
    from callgate.executor.invocations import EARLIER_LAYOUT, Invocations

    if topics.changelog(Invocations.name) in existing:
        return
    earlier = [topics.changelog(p) for p in EARLIER_LAYOUT if topics.changelog(p) in existing]
    if earlier:
        raise Rejection(
            Code.USAGE,
            f"the topics under prefix {topics.prefix!r} were run by the earlier process layout "
            f"({', '.join(earlier)}); stop it with no call in flight and serve under a new "
            "topic prefix (docs/how-to/upgrades.md, 'From the three-process layout')",
        )


def create_topics(app: Wiring, existing: set[str] | None = None) -> list[str]:
    settings = app.settings
    assert settings.bootstrap_servers
    topics = Topics(settings.topic_prefix, settings.partitions, settings.requests_retention_ms)
    if existing is not None:
        refuse_earlier_layout(topics, existing)
    admin = make_admin(settings.brokers)
    specs = topics.specs(app.processes(), views_of(app))
    replicas = settings.replication_factor or replication_for(admin, settings.timeout_s)
    return ensure_topics(admin, specs, replicas, timeout_s=settings.timeout_s)


def create_topics_when_reachable(
    app: Wiring, stop: threading.Event, log_format: LogFormat
) -> list[str] | None:
    """``create_topics`` once a broker answers: each failed attempt prints one line and
    waits (1 s, 2 s, 4 s, ... at most ``RETRY_MAX_S``); ``None`` if ``stop`` came first."""
    brokers = app.settings.brokers
    bootstrap = brokers.servers
    timeout_s = app.settings.timeout_s
    attempt = 0
    while not stop.is_set():
        attempt += 1
        try:
            return create_topics(app, probe(brokers, timeout_s))
        except (Rejection, KafkaException, TimeoutError) as exc:
            if isinstance(exc, Rejection) and exc.code is not Code.BROKER_UNAVAILABLE:
                raise
            error = (
                exc
                if isinstance(exc, Rejection)
                else broker_unavailable(brokers, timeout_s, str(exc))
            )
            wait_s = min(RETRY_MAX_S, 2.0 ** (attempt - 1))
            serve_line(
                log_format,
                "broker_unavailable",
                f"callgate serve: attempt {attempt}: {error.code.value}: {error.message}; "
                f"retrying in {wait_s:g}s",
                attempt=attempt,
                code=error.code.value,
                bootstrap_servers=bootstrap,
                retry_in_s=wait_s,
            )
            stop.wait(wait_s)
    return None


def worker_env(
    settings: Settings, log_format: LogFormat = "text", verbosity: int = 0
) -> dict[str, str]:
    env = dict(os.environ)
    env[LOG_FORMAT_ENV] = log_format
    env[VERBOSE_ENV] = str(verbosity)
    env["CALLGATE_STATE_DIR"] = str(settings.state_dir.resolve())
    env["CALLGATE_BACKEND"] = "kafka"
    env["CALLGATE_BOOTSTRAP_SERVERS"] = settings.bootstrap_servers or ""
    env["CALLGATE_TOPIC_PREFIX"] = settings.topic_prefix
    env["CALLGATE_PARTITIONS"] = str(settings.partitions)
    env["CALLGATE_DEV"] = "1" if settings.dev else "0"
    if settings.config_file is not None:
        env["CALLGATE_CONFIG"] = str(settings.config_file.resolve())
    env["CALLGATE_INSTANCE_ID"] = settings.instance_id
    env["CALLGATE_SUPERVISOR_PID"] = str(os.getpid())  # worker.stop_with_parent
    if settings.profile is not None:
        env["CALLGATE_PROFILE"] = str(settings.profile.resolve())
    if settings.faults:
        import json

        env["CALLGATE_FAULTS"] = json.dumps(settings.faults)
    return env


FENCED_LIMIT = 3  # fenced exits of one process within FENCED_WINDOW_S: an id clash
FENCED_WINDOW_S = 60.0
# A child that exits again soon after it started (the broker is still away) is restarted
# after a pause that doubles up to RESTART_MAX_S: no busy loop of restarts, and one restart
# a few seconds after the broker is back. A child that ran RESTART_RESET_S starts over.
RESTART_MAX_S = 4.0
RESTART_RESET_S = 60.0


class InstanceClash(RuntimeError):
    """Another live instance runs with this instance's id (its children keep being fenced)."""


def lock_instance(settings: Settings) -> int | None:
    """Hold ``<state_dir>/kafka-state/<instance_id>.lock`` for this serve's lifetime; None
    when another serve holds it (same id, same state directory)."""
    path = settings.state_dir / "kafka-state" / f"{settings.instance_id}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class Supervisor:
    """Starts one child per process and restarts any that exits while not stopping.

    A child that exits fenced (``worker.EXIT_FENCED``) is restarted too (a transaction that
    outlived ``transaction.timeout.ms`` fences its producer), but ``FENCED_LIMIT`` fenced
    exits of one process within ``FENCED_WINDOW_S`` raise ``InstanceClash``. A child ended by
    its watchdog (``worker.EXIT_STALLED``) is counted in ``stalls`` and restarted; the
    restarted one logs when it commits again. Restarts of a child that keeps exiting
    soon after it started are spaced (``RESTART_MAX_S``).
    """

    def __init__(
        self,
        app: Wiring,
        names: Sequence[str],
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.app = app
        self.names = list(names)
        self.extra_args = list(extra_args)
        self.env = env if env is not None else worker_env(app.settings)
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts = 0
        self.fenced: dict[str, list[float]] = {}
        self.stalls: dict[str, int] = {}
        self._started: dict[str, float] = {}  # time.monotonic() each child started
        self._pause: dict[str, float] = {}  # the wait before the next quick restart
        self._due: dict[str, tuple[float, dict[str, str]]] = {}  # restarts waiting

    def spawn(self, name: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        from callgate.adapters.kafka.worker import RESTARTED_ENV

        cmd = [sys.executable, "-m", "callgate.surfaces.kafka_worker", name, *self.extra_args]
        env = {k: v for k, v in self.env.items() if k != RESTARTED_ENV}
        child = self.launch(name, cmd, {**env, **(extra_env or {})})
        self.children[name] = child
        self._started[name] = time.monotonic()
        return child

    def launch(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start one child (its output goes where serve's goes)."""
        return subprocess.Popen(cmd, env=env)

    def start(self) -> None:
        for name in self.names:
            self.spawn(name)

    def check(self) -> None:
        from callgate.adapters.kafka.worker import EXIT_FENCED, EXIT_STALLED, RESTARTED_ENV

        now = time.monotonic()
        for name, child in list(self.children.items()):
            code = child.poll()
            if code is None or name in self._due:
                continue
            extra_env: dict[str, str] = {}
            if code == EXIT_STALLED:
                self.stalls[name] = self.stalls.get(name, 0) + 1
                extra_env[RESTARTED_ENV] = repr(time.time())
            if code == EXIT_FENCED:
                now = time.monotonic()
                recent = [t for t in self.fenced.get(name, []) if now - t < FENCED_WINDOW_S]
                self.fenced[name] = [*recent, now]
                if len(self.fenced[name]) >= FENCED_LIMIT:
                    raise InstanceClash(
                        f"{name} was fenced {FENCED_LIMIT} times in {FENCED_WINDOW_S:.0f}s: "
                        f"another instance runs as {self.app.settings.instance_id!r}; "
                        "give each instance its own --instance-id"
                    )
            ran_s = now - self._started.get(name, now)
            pause = 0.0 if ran_s >= RESTART_RESET_S else self._pause.get(name, 0.0)
            self._pause[name] = min(RESTART_MAX_S, max(0.5, 2 * pause))
            self._due[name] = (now + pause, extra_env)
        self._start_due(now)

    def _start_due(self, now: float) -> None:
        """Start the restarts whose pause is over."""
        for name, (due, extra_env) in list(self._due.items()):
            if now >= due:
                del self._due[name]
                self.restarts += 1
                self.spawn(name, extra_env)

    def stop(self, grace_s: float = 10.0) -> None:
        for child in self.children.values():
            if child.poll() is None:
                child.terminate()
        deadline = time.monotonic() + grace_s
        for child in self.children.values():
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def serve_kafka(
    app: Wiring,
    stop: threading.Event,
    only: Sequence[str],
    log_format: LogFormat = "text",
    verbosity: int = 0,
) -> int:
    """Hold this instance's lock, create the topics (retrying until a broker answers), then
    supervise one child per process until ``stop``; prints a line when it starts and when it
    stops. Raises ``Rejection(busy)`` when this instance id already runs here or elsewhere."""
    try:  # checked here, once: a child that refused them would be restarted forever
        consumer_overrides([])
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    instance = app.settings.instance_id
    lock = lock_instance(app.settings)
    if lock is None:
        raise Rejection(Code.BUSY, f"another callgate serve runs as instance {instance!r} here")
    try:
        bootstrap = app.settings.bootstrap_servers
        created = create_topics_when_reachable(app, stop, log_format)
        if created is None:
            serve_line(log_format, "stopped", "callgate serve stopped (no broker was reached)")
            return 0
        app.keys  # noqa: B018  (key material exists before the children start: all share it)
        names = list(only) or [p.name for p in app.processes()]
        env = worker_env(app.settings, log_format, verbosity)
        sup = Supervisor(app, names, ["--report-settled"], env=env)
        sup.start()
        serve_line(
            log_format,
            "started",
            f"callgate serve (pid {os.getpid()}) on Kafka {bootstrap} as instance {instance} "
            f"({len(names)} processes: {', '.join(names)}; {len(created)} topics created)",
            backend="kafka",
            bootstrap_servers=bootstrap,
            instance_id=instance,
            processes=names,
            topics_created=len(created),
            pid=os.getpid(),
        )
        try:
            while not stop.wait(0.5):
                sup.check()
        except InstanceClash as exc:
            raise Rejection(Code.BUSY, str(exc)) from None
        finally:
            sup.stop()
            serve_line(
                log_format,
                "stopped",
                f"callgate serve stopped ({sup.restarts} restarts)",
                restarts=sup.restarts,
            )
        return 0
    finally:
        os.close(lock)
