"""Toxiproxy (Shopify's TCP fault proxy, ADR 0088) on loopback, driven through its HTTP API.

The network chaos run (``python -m tools chaos --network``) and the network tier put it
between callgate and the broker and between callgate and an HTTP upstream: every byte of
those connections passes through it, and its *toxics* delay, throttle, swallow or reset
them. The server is built once from the Go module proxy into a cache directory
(``make toxiproxy-fetch``; Go needed), like the Kafka jars; ``CALLGATE_TOXIPROXY`` names
another ``toxiproxy-server`` binary.

``Toxiproxy()`` starts the server on a free loopback port (its API only, no proxy yet);
``proxy(name, upstream)`` listens on another free loopback port and forwards to
``upstream``; ``toxic``/``clear``/``enable`` change what a proxy does to its
connections; ``stop`` ends the server (and with it every proxied connection).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from tools import end_process
from tools.cache import tool_cache
from tools.ports import free_port

TOXIPROXY_VERSION = "v2.5.0"  # the module the cache is built from (go install ...@VERSION)
MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
BINARY_ENV = "CALLGATE_TOXIPROXY"
CACHE_ENV = "CALLGATE_TOXIPROXY_CACHE"
GO_ENV = "CALLGATE_GO"
Stream = Literal["upstream", "downstream"]


class ToxiproxyUnavailable(RuntimeError):
    """No binary and no Go to build one, the build failed, or the server did not start."""


def cache_dir() -> Path:
    """``$CALLGATE_TOXIPROXY_CACHE``, else ``~/.cache/callgate/toxiproxy``."""
    return tool_cache("toxiproxy", CACHE_ENV)


def cached_binary() -> Path:
    return cache_dir() / TOXIPROXY_VERSION / "bin" / "server"


def find_binary() -> Path | None:
    """``$CALLGATE_TOXIPROXY``, else the cache's build, else ``toxiproxy-server`` on PATH."""
    candidates = [os.environ.get(BINARY_ENV, ""), str(cached_binary())]
    candidates.append(shutil.which("toxiproxy-server") or "")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def unavailable() -> str | None:
    """Why no Toxiproxy server can start here without building one, or None."""
    if find_binary() is None:
        return (
            f"no toxiproxy server ({BINARY_ENV}, {cached_binary()} or toxiproxy-server on "
            "PATH; make toxiproxy-fetch builds it)"
        )
    return None


def find_go() -> str:
    for candidate in (os.environ.get(GO_ENV, ""), shutil.which("go") or "", "/usr/local/go/bin/go"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ToxiproxyUnavailable("no Go toolchain (go on PATH, /usr/local/go or CALLGATE_GO)")


def build(version: str = TOXIPROXY_VERSION) -> Path:
    """``go install`` the server from the Go module proxy into the cache (once); its path.
    A GOPATH of its own under the cache: nothing is written to the user's Go folders."""
    target = cache_dir() / version
    binary = target / "bin" / "server"
    if os.access(binary, os.X_OK):
        return binary
    target.mkdir(parents=True, exist_ok=True)
    env = os.environ | {
        "GOPATH": str(target / "gopath"),
        "GOBIN": str(target / "bin"),
        "GOFLAGS": "-modcacherw",  # the module cache can be removed without chmod
        "CGO_ENABLED": "0",
    }
    argv = [find_go(), "install", f"{MODULE}@{version}"]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired as exc:
        raise ToxiproxyUnavailable("go install did not finish within 900 s") from exc
    if done.returncode != 0 or not os.access(binary, os.X_OK):
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise ToxiproxyUnavailable(f"go install exited {done.returncode}: {' | '.join(tail)}")
    shutil.rmtree(target / "gopath", ignore_errors=True)  # sources and module cache
    return binary


class Toxiproxy:
    """Context manager: a Toxiproxy server with its API on a free loopback port."""

    def __init__(self, start_timeout_s: float = 20.0) -> None:
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None
        self.api_port = 0
        self.listen: dict[str, int] = {}  # proxy name -> its loopback port

    def start(self) -> Toxiproxy:
        binary = find_binary()
        if binary is None:
            raise ToxiproxyUnavailable(unavailable() or "no toxiproxy server")
        fd, name = tempfile.mkstemp(prefix="callgate-toxiproxy-", suffix=".log")
        self._log = Path(name)
        for _ in range(3):  # a free port may be taken meanwhile
            self.api_port = free_port()
            argv = [str(binary), "-host", "127.0.0.1", "-port", str(self.api_port)]
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd)
            if self._wait_ready():
                os.close(fd)
                return self
            self._terminate()
        os.close(fd)
        tail = self._log.read_text(errors="replace")[-800:]
        self.stop()
        raise ToxiproxyUnavailable(f"toxiproxy did not answer: {tail}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self._start_timeout_s
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            with contextlib.suppress(OSError, ToxiproxyUnavailable):
                self._api("GET", "/version")
                return True
            time.sleep(0.05)
        return False

    def _api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.api_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise ToxiproxyUnavailable(f"{method} {path}: {exc.code} {detail}") from exc
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text  # /version answers plain text

    def proxy(self, name: str, upstream: str, port: int = 0, enabled: bool = True) -> int:
        """A proxy listening on loopback (``port``, or a free one) that forwards to
        ``upstream`` (host:port); its port."""
        port = port or free_port()
        body = {"name": name, "listen": f"127.0.0.1:{port}", "upstream": upstream}
        self._api("POST", "/proxies", {**body, "enabled": enabled})
        self.listen[name] = port
        return port

    def enable(self, name: str, enabled: bool = True) -> None:
        """A disabled proxy closes its connections and refuses new ones (nothing listens)."""
        self._api("POST", f"/proxies/{name}", {"enabled": enabled})

    def toxic(
        self,
        proxy: str,
        kind: str,
        stream: Stream = "downstream",
        toxicity: float = 1.0,
        **attributes: int,
    ) -> str:
        """Add a toxic (``latency``: latency, jitter ms; ``bandwidth``: rate KB/s;
        ``timeout``: timeout ms, 0 never closes; ``reset_peer``: timeout ms); its name."""
        name = f"{kind}_{stream}"
        body = {"name": name, "type": kind, "stream": stream, "toxicity": toxicity}
        self._api("POST", f"/proxies/{proxy}/toxics", {**body, "attributes": attributes})
        return name

    def clear(self, proxy: str) -> None:
        """Remove every toxic of ``proxy`` and enable it again."""
        found = self._api("GET", f"/proxies/{proxy}/toxics") or []
        for toxic in found:
            self._api("DELETE", f"/proxies/{proxy}/toxics/{toxic['name']}")
        self.enable(proxy)

    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self._api("GET", f"/proxies/{proxy}/toxics") or []
        return found

    def _terminate(self) -> None:
        proc, self._proc = self._proc, None
        end_process(proc, grace_s=10)

    def stop(self) -> None:
        """End the server (every proxy and connection with it) and remove its log."""
        self._terminate()
        self.listen = {}
        if self._log is not None:
            self._log.unlink(missing_ok=True)
            self._log = None

    def __enter__(self) -> Toxiproxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Toxiproxy, built from the Go module proxy.")
    parser.add_argument("action", choices=["fetch"])
    parser.parse_args(argv)
    try:
        binary = build()
    except ToxiproxyUnavailable as exc:
        print(f"toxiproxy: {exc}", file=sys.stderr)
        return 1
    print(f"Toxiproxy server: {binary}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
