"""``callgate serve`` on Kafka: create the topics, run every process as a supervised child.

Each process runs in its own OS process (both cores, and one crash takes down one
process). The supervisor restarts a child that dies; the restarted child fences its
previous incarnation (same ``transactional.id``) and restores its state from the
changelog before consuming again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from confluent_kafka.admin import AdminClient

from callgate.adapters.kafka.topics import Topics, ensure_topics
from callgate.bootstrap import App, Settings

if TYPE_CHECKING:
    from callgate.surfaces.render import Renderer


def views_of(app: App) -> dict[str, str]:
    """view name -> the process that writes it."""
    return {view: p.name for p in app.projections() for view in getattr(p, "views", ())}


def create_topics(app: App) -> list[str]:
    settings = app.settings
    assert settings.bootstrap_servers
    topics = Topics(settings.topic_prefix, settings.partitions)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
    return ensure_topics(admin, topics.specs(app.processes(), views_of(app)))


def worker_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env["CALLGATE_STATE_DIR"] = str(settings.state_dir.resolve())
    env["CALLGATE_BACKEND"] = "kafka"
    env["CALLGATE_BOOTSTRAP_SERVERS"] = settings.bootstrap_servers or ""
    env["CALLGATE_TOPIC_PREFIX"] = settings.topic_prefix
    env["CALLGATE_PARTITIONS"] = str(settings.partitions)
    if settings.profile is not None:
        env["CALLGATE_PROFILE"] = str(settings.profile.resolve())
    if settings.faults:
        import json

        env["CALLGATE_FAULTS"] = json.dumps(settings.faults)
    return env


class Supervisor:
    """Starts one child per process and restarts any that exits while not stopping."""

    def __init__(self, app: App, names: Sequence[str], extra_args: Sequence[str] = ()) -> None:
        self.app = app
        self.names = list(names)
        self.extra_args = list(extra_args)
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts = 0

    def spawn(self, name: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "callgate.adapters.kafka.worker", name, *self.extra_args]
        child = subprocess.Popen(cmd, env=worker_env(self.app.settings))
        self.children[name] = child
        return child

    def start(self) -> None:
        for name in self.names:
            self.spawn(name)

    def check(self) -> None:
        for name, child in list(self.children.items()):
            if child.poll() is not None:
                self.restarts += 1
                self.spawn(name)

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


def serve_kafka(app: App, stop: threading.Event, only: Sequence[str], out: Renderer | Any) -> int:
    created = create_topics(app)
    names = list(only) or [p.name for p in app.processes()]
    sup = Supervisor(app, names)
    sup.start()
    out.err.print(
        f"[green]callgate serve[/] on Kafka {app.settings.bootstrap_servers} "
        f"({len(names)} processes: {', '.join(names)}; {len(created)} topics created)"
    )
    try:
        while not stop.wait(0.5):
            sup.check()
    finally:
        sup.stop()
    return 0
