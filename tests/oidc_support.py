"""A real OpenID Connect provider on loopback for the console's sign-in tests:
``oidc-provider`` from npm (pinned in tests/oidc/package-lock.json, installed by
``make oidc-provider``), run by Node.js with its own login and consent pages.

``OpenIdProvider`` starts ``node tests/oidc/provider.mjs`` on a free port with one
confidential client (the console) and the given accounts, each with the claims its ID
tokens carry (by default ``tenant`` and ``roles``, scope ``callgate``; ``claims`` names
other scopes and claims, as Entra ID or Okta issue them), and stops it with SIGTERM.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.ports import free_port

from tests.e2e.helpers import REPO

PROVIDER_DIR = REPO / "tests" / "oidc"
CLIENT_ID = "callgate-console"
CLIENT_SECRET = "console-secret-for-tests"


def missing() -> str | None:
    """Why the provider cannot start here, or None."""
    if shutil.which("node") is None:
        return "oidc-provider tests skipped: Node.js (node) is absent"
    if not (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir():
        return "oidc-provider tests skipped: run `make oidc-provider` (npm ci in tests/oidc)"
    return None


class OpenIdProvider:
    def __init__(
        self,
        log: Path,
        redirect_uri: str,
        accounts: Mapping[str, Mapping[str, Any]],
        ttl_s: int = 3600,
        claims: Mapping[str, Sequence[str]] | None = None,
        kid: str = "idp-rs256-1",
    ) -> None:
        """``claims``: scope -> the claims of the accounts it puts in the ID token; ``kid``:
        its signing key's id (two providers beside each other need two)."""
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.log = log
        conf = {
            "port": self.port,
            "accounts": accounts,
            "ttl_s": ttl_s,
            "kid": kid,
            **({"claims": {s: list(c) for s, c in claims.items()}} if claims else {}),
            "clients": [
                {
                    "client_id": CLIENT_ID,
                    "client_secret": CLIENT_SECRET,
                    "redirect_uris": [redirect_uri],
                    "grant_types": ["authorization_code"],
                    "response_types": ["code"],
                    "token_endpoint_auth_method": "client_secret_basic",
                }
            ],
        }
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            ["node", str(PROVIDER_DIR / "provider.mjs"), json.dumps(conf)],
            stdout=self._out,
            stderr=subprocess.STDOUT,
            cwd=PROVIDER_DIR,
        )
        deadline = time.monotonic() + 30
        while f"ready {self.issuer}" not in log.read_text():
            assert self.proc.poll() is None, f"oidc-provider exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"oidc-provider not ready: {log.read_text()}"
            time.sleep(0.05)

    def issuer_config(
        self,
        redirect_uri: str,
        scopes: Sequence[str] = ("openid", "callgate"),
        skew_s: int = 5,
        extra: str = "",
        name: str = "Test IdP",
    ) -> str:
        """The ``[[sessions.issuers]]`` table of ``callgate.toml`` for this provider;
        ``extra``: more keys of the table (its tenants, a preset, ...)."""
        listed = ", ".join(f'"{s}"' for s in scopes)
        return (
            "[[sessions.issuers]]\n"
            f'issuer = "{self.issuer}"\n'
            f'name = "{name}"\n'
            f'client_id = "{CLIENT_ID}"\n'
            f'client_secret = "{CLIENT_SECRET}"\n'
            f'redirect_uri = "{redirect_uri}"\n'
            f"scopes = [{listed}]\n"
            'algorithms = ["RS256"]\n'
            f"clock_skew_s = {skew_s}\n"
            f"{extra}"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._out.close()
