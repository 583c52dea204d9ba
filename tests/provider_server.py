"""The reference HTTP provider as a real subprocess on loopback, for tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from tools.ports import free_port

REPO = Path(__file__).resolve().parents[1]
CREDENTIAL_ENV = "REFERENCE_PROVIDER_CREDENTIAL"


class ReferenceServer:
    """``python -m callgate.providers.reference_server`` with a bearer credential."""

    def __init__(self, credential: str, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "callgate.providers.reference_server",
             "--port", str(self.port), "--credential-env", CREDENTIAL_ENV],
            env={**os.environ, CREDENTIAL_ENV: credential},
            stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while True:
            try:
                self.control("GET", "health")
                return
            except OSError:
                assert self.proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "reference server did not start"
                time.sleep(0.05)

    def control(self, method: str, what: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}/_control/{what}", data=data, method=method,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._log.close()
