"""``callgate serve --http`` as a subprocess, for the tests of the HTTP API and the console.

``HttpServe`` starts the installed command on a free loopback port (embedded by default,
on Kafka with a ``Deployment``), waits for ``/readyz`` and stops it with SIGTERM. Session
tokens come from the state directory's development issuer, as ``callgate session issue``
makes them. ``short_ttl_profile`` writes a copy of the default profile whose
``deploys.trigger`` approvals expire after a few seconds (the expiry tests).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import httpx
import yaml
from tools.ports import free_port

from callgate.bootstrap import Settings
from tests.dev_sessions import dev_token
from tests.e2e.helpers import DEFAULT_PROFILE, REPO, callgate_argv, cli_env

REFUND_BIG = {"order_id": "ORD-77", "amount_cents": 25000, "currency": "EUR"}  # high impact

# The hostile classes a JSON body can carry, each with the status and code that refuse it
# before any route acts: oversized (over the 64 KiB body limit), deeply nested, duplicate
# keys (after unescaping), non-finite numbers, invalid Unicode.
HOSTILE_JSON: dict[str, tuple[bytes, int, str]] = {
    "oversized": (b'{"x": "' + b"y" * 70_000 + b'"}', 413, "payload_too_large"),
    "deeply nested": (b"[" * 100 + b"]" * 100, 422, "invalid_request"),
    "duplicate keys": (b'{"type": "block_actions", "typ\\u0065": "x"}', 422, "invalid_request"),
    "NaN": (b'{"type": "block_actions", "n": NaN}', 422, "invalid_request"),
    "infinite": (b'{"type": "block_actions", "n": 1e400}', 422, "invalid_request"),
    "invalid UTF-8": (b'{"type": "block_actions", "s": "\xff"}', 422, "invalid_request"),
    "lone surrogate": (b'{"type": "block_actions", "s": "\\ud800"}', 422, "invalid_request"),
}

# The browser tier's Chromium (``browser`` fixture, tests/http/conftest.py).
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def short_ttl_profile(directory: Path, tool: str = "deploys.trigger", seconds: int = 4) -> Path:
    """The default profile with ``tool``'s approvals expiring after ``seconds``."""
    directory.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(DEFAULT_PROFILE.read_text())
    shutil.copy(DEFAULT_PROFILE.parent / doc["policy_file"], directory / doc["policy_file"])
    doc["tools"][tool]["approval_ttl_seconds"] = seconds
    path = directory / "profile.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class HttpServe:
    """``callgate --state-dir D [--profile P] serve --http 127.0.0.1:PORT``."""

    def __init__(
        self,
        state_dir: Path,
        log: Path,
        *,
        profile: Path | None = None,
        env: Mapping[str, str] | None = None,
        dev: bool = False,
        port: int | None = None,
        serve_args: Sequence[str] = (),
    ) -> None:
        """``serve_args``: more options of ``serve`` (``--only PROCESS``)."""
        self.state_dir = state_dir
        self.profile = profile
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._stderr: TextIO = log.open("w")
        argv = [*callgate_argv(), "--state-dir", str(state_dir)]
        if profile is not None:
            argv += ["--profile", str(profile)]
        argv += ["serve", "--http", f"127.0.0.1:{self.port}", *serve_args]
        self.env = dict(env or {})
        full_env = {**cli_env(dev=dev), **self.env}
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=self._stderr, env=full_env, cwd=REPO
        )
        # The tests mint development tokens on the state directory whatever the server's
        # mode: a server not in development mode must refuse them.
        self._settings = Settings(state_dir=state_dir, profile=profile, dev=True)

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc.poll() is None, f"serve exited: {self.log.read_text()}"
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"not ready: {self.log.read_text()}"
            time.sleep(0.1)

    def token(self, user: str, tenant: str, *roles: str, ttl_seconds: int = 3600) -> str:
        """A development session token (the state directory's issuer key)."""
        return dev_token(self._settings, user, tenant, roles, ttl_seconds)

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(timeout=10)
        self._stderr.close()
        return code


@contextlib.contextmanager
def running(serve: HttpServe) -> Iterator[HttpServe]:
    """``serve`` once it answers; stopped after, and it must have stopped cleanly (exit 0)
    and without a traceback in its log."""
    try:
        serve.wait_ready()
        yield serve
    finally:
        assert serve.stop() == 0, serve.log.read_text()
        assert "Traceback" not in serve.log.read_text()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def wait_until(predicate: Any, timeout_s: float, what: str, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)
