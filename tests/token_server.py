"""An OAuth 2.0 authorization server's token endpoint and an HTTP provider that logs the
``Authorization`` header it receives, over real HTTP on loopback (ADR 0081 tests).

``TokenServer`` implements what callgate asks of an upstream's authorization server: the
token exchange of RFC 8693 (the subject token is callgate's assertion, verified with the
public key the server trusts for its issuer; the issued token's ``sub`` is the assertion's,
``aud`` the requested audience, and ``act`` names the authenticated client, with the
assertion's own chain nested under it) and the client-credentials grant; clients
authenticate with HTTP Basic. ``refuse`` makes it answer ``invalid_grant``. The Keycloak
tier (``tests/keycloak``) runs the same tests against a real Keycloak.

``LoggingProvider`` speaks the HTTP provider protocol (docs/provider-http.openapi.yaml)
minimally and records, per request, the path and the ``Authorization`` header.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt

from callgate.domain.keys import PrivateKey, PublicKey, algorithm_of

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"


def _serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class TokenServer:
    """``POST /token``; ``issued`` lists the claims of every token issued, ``requests``
    the form of every request."""

    def __init__(
        self,
        issuer_key: PrivateKey,
        clients: dict[str, str],
        trusted: dict[str, PublicKey],
        expires_in: int = 300,
    ) -> None:
        self.key = issuer_key
        self.clients = clients  # client_id -> secret
        self.trusted = trusted  # assertion issuer -> its public key
        self.expires_in = expires_in
        self.refuse = False
        self.answer_with: dict[str, Any] | None = None  # a 200 answer instead of a token
        self.leeway_s = 0  # clock skew allowed for the subject token (a test's own clock)
        self.requests: list[dict[str, str]] = []
        self.issued: list[dict[str, Any]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                form = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                owner.requests.append(form)
                status, body = owner.answer(form, self.headers.get("Authorization", ""))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server, self.url = _serve(Handler)
        self.token_endpoint = self.url + "/token"
        self.issuer = self.url

    def answer(self, form: dict[str, str], authorization: str) -> tuple[int, dict[str, Any]]:
        client = self._client(authorization)
        if client is None:
            return 401, {"error": "invalid_client"}
        if self.refuse:
            return 400, {"error": "invalid_grant", "error_description": "refused by the test"}
        if self.answer_with is not None:
            return 200, self.answer_with
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "aud": form.get("audience", ""),
            "iat": now,
            "exp": now + self.expires_in,
            "scope": form.get("scope", ""),
            "azp": client,
        }
        if form.get("grant_type") == "client_credentials":
            claims["sub"] = client
        elif form.get("grant_type") == TOKEN_EXCHANGE:
            try:
                subject = self._subject(form)
            except jwt.PyJWTError as exc:
                return 400, {"error": "invalid_request", "error_description": str(exc)}
            claims["sub"] = subject["sub"]
            act: dict[str, Any] = {"sub": client}
            if "act" in subject:
                act["act"] = subject["act"]
            claims["act"] = act
        else:
            return 400, {"error": "unsupported_grant_type"}
        self.issued.append(claims)
        token = jwt.encode(claims, self.key, algorithm=algorithm_of(self.key))
        body = {"access_token": token, "token_type": "Bearer", "expires_in": self.expires_in}
        if form.get("grant_type") == TOKEN_EXCHANGE:
            body["issued_token_type"] = "urn:ietf:params:oauth:token-type:access_token"
        return 200, body

    def _client(self, authorization: str) -> str | None:
        if not authorization.startswith("Basic "):
            return None
        raw = base64.b64decode(authorization[6:]).decode()
        client, _, secret = raw.partition(":")
        client, secret = urllib.parse.unquote(client), urllib.parse.unquote(secret)
        return client if self.clients.get(client) == secret else None

    def _subject(self, form: dict[str, str]) -> dict[str, Any]:
        token = form.get("subject_token", "")
        issuer = jwt.decode(token, options={"verify_signature": False}).get("iss")
        key = self.trusted.get(str(issuer))
        if key is None:
            raise jwt.InvalidIssuerError(f"subject token issuer {issuer!r} is not trusted")
        claims: dict[str, Any] = jwt.decode(
            token, key, algorithms=[algorithm_of(key)], audience=self.issuer, leeway=self.leeway_s
        )
        return claims

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class LoggingProvider:
    """The HTTP provider protocol, minimally: every request's path and ``Authorization``
    header are in ``heard``; ``/execute`` echoes what it applied (once per token)."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, str | None]] = []
        self.applied: dict[str, dict[str, Any]] = {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                owner.heard.append((self.path, self.headers.get("Authorization")))
                token = urllib.parse.unquote(self.path.rsplit("/", 1)[-1])
                found = owner.applied.get(token)
                self._reply({"found": found is not None, "result": found})

            def do_POST(self) -> None:
                owner.heard.append((self.path, self.headers.get("Authorization")))
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path == "/execute":
                    result = owner.applied.setdefault(
                        body["token"], {"target": body["target"], "args": body["args"]}
                    )
                    self._reply({"result": result})
                elif self.path == "/dry_run":
                    self._reply({"snapshot": {"target": body["target"], "args": body["args"]}})
                else:  # /describe: every target is acme's
                    self._reply({"found": True, "tenant": "acme", "attributes": {}})

            def log_message(self, *args: Any) -> None:
                pass

        self.server, self.url = _serve(Handler)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
