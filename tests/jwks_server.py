"""An identity provider's published keys over real HTTP on loopback, for rotation tests:
a discovery document and a JWKS document the test changes while callgate runs, and a
count of the requests (to see what callgate fetched, and when)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt

from callgate.adapters.keyfiles import jwks
from callgate.domain.keys import PrivateKey, algorithm_of


class KeyServer:
    """Serves ``/.well-known/openid-configuration`` and ``/jwks`` for ``issuer``; signs
    tokens with its private keys. ``up = False`` answers 503 (an outage).

    ``path``: the issuer's path as the provider names it (Okta's ``/oauth2/default``,
    Auth0's trailing ``/``), under which both documents are served; ``jwks_path``: where
    under it the keys are (Okta's ``/v1/keys``)."""

    def __init__(self, path: str = "", jwks_path: str = "/jwks") -> None:
        root = path.rstrip("/")
        self.private: dict[str, PrivateKey] = {}
        self.published: list[str] = []  # the kids in the JWKS, in order
        self.requests: list[str] = []
        self.up = True
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.requests.append(self.path)
                body: Any
                if not owner.up:
                    self.send_response(503)
                    self.end_headers()
                    return
                if self.path == root + "/.well-known/openid-configuration":
                    body = {
                        "issuer": owner.issuer,
                        "authorization_endpoint": owner.base + root + "/auth",
                        "token_endpoint": owner.base + root + "/token",
                        "jwks_uri": owner.jwks_uri,
                    }
                elif self.path == owner.jwks_path:
                    body = jwks({k: owner.private[k].public_key() for k in owner.published})
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.issuer = self.base + path
        self.jwks_path = root + jwks_path
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def jwks_uri(self) -> str:
        return self.base + self.jwks_path

    def add(self, kid: str, key: PrivateKey, publish: bool = True) -> None:
        self.private[kid] = key
        if publish:
            self.published.append(kid)

    def remove(self, kid: str) -> None:
        self.published.remove(kid)

    def token(self, kid: str, claims: dict[str, Any], alg: str | None = None) -> str:
        key = self.private[kid]
        return jwt.encode(
            {"iss": self.issuer, **claims},
            key,
            algorithm=alg or algorithm_of(key),
            headers={"kid": kid},
        )

    def jwks_fetches(self) -> int:
        return self.requests.count(self.jwks_path)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
