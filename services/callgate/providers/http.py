"""A provider reached over HTTP with JSON (stdlib ``urllib``; docs/contract.md "Providers", C12).

Wire protocol (all bodies JSON objects):

- ``POST {base}/dry_run`` ``{tool, target, args, tenant}`` → ``{"snapshot": {...}}``
- ``POST {base}/execute`` ``{tool, target, args, tenant, token, invocation_id}`` with header
  ``Idempotency-Key: <token>`` → ``{"result": {...}}``
- ``GET {base}/lookup/<token>`` → ``{"found": bool, "result": {...} | null}``
- ``POST {base}/describe`` ``{tool, target}`` → ``{"found": bool, "tenant": str | null,
  "attributes": {...}}`` (the resource's owner and attributes, C7)

The whole protocol is ``docs/provider-http.openapi.yaml``. With credentials every request
carries ``Authorization: Bearer <credential>``; with ``upstream_token`` (``tokens``) it
carries a token obtained for the call instead (``providers.upstream_tokens``, ADR 0081):
for the user by token exchange, or for callgate by client credentials. That token is
obtained before the request is built; when it cannot be, ``TokenExchangeFailed`` is
raised and nothing is sent. ``retries`` repeats the read-only calls
(dry-run, lookup, describe) after a transport failure or a 5xx; ``execute`` is never
repeated here, because a repeat of an effect is the executor's decision after a ``lookup``
(C12).

Mapping failures to what is known about the effect (C12), failing closed:

- a socket timeout is ``ProviderTimeout`` (the server may be applying the effect);
- an HTTP error status is ``ProviderError`` (the server answered that it failed), except
  ``504 Gateway Timeout`` on execute, which says an upstream may have applied it;
- on execute, any transport failure after the request may have left (connection reset,
  unreadable 2xx body) is ``ProviderTimeout``; a refused connection or an unknown host
  is ``ProviderError`` because nothing was sent;
- redirects are not followed (a POST must not silently become a GET elsewhere).
"""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from callgate.providers.base import (
    DryRunResult,
    ExecutionResult,
    Lookup,
    ProviderError,
    ProviderTimeout,
    ResourceDescription,
)
from callgate.providers.upstream_tokens import TokenExchangeFailed, UpstreamTokens
from callgate.tracing import outgoing


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: Any,
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None  # urllib then raises HTTPError with the 3xx status


class HttpProvider:
    def __init__(
        self,
        name: str,
        base_url: str,
        timeout_s: float = 10.0,
        retries: int = 0,
        credential: str | None = None,
        tokens: UpstreamTokens | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if retries < 0:
            raise ValueError("retries must not be negative")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        if credential and tokens is not None:
            raise ValueError("give either a static credential or upstream tokens, not both")
        self._auth = {"Authorization": f"Bearer {credential}"} if credential else {}
        self._tokens = tokens
        self._opener = urllib.request.build_opener(_NoRedirect())

    def __repr__(self) -> str:  # never the credential
        return f"HttpProvider({self.name!r}, {self.base_url!r})"

    def dry_run(self, tool: str, target: str, args: Mapping[str, Any], tenant: str) -> DryRunResult:
        payload = {"tool": tool, "target": target, "args": dict(args), "tenant": tenant}
        body = self._read_only("POST", "/dry_run", payload)
        return DryRunResult(_object(body.get("snapshot"), "snapshot", effectful=False))

    def execute(
        self,
        tool: str,
        target: str,
        args: Mapping[str, Any],
        tenant: str,
        token: str,
        invocation_id: str,
    ) -> ExecutionResult:
        payload = {
            "tool": tool,
            "target": target,
            "args": dict(args),
            "tenant": tenant,
            "token": token,
            "invocation_id": invocation_id,
        }
        body = self._call("POST", "/execute", payload, {"Idempotency-Key": token}, effectful=True)
        return ExecutionResult(_object(body.get("result"), "result", effectful=True))

    def lookup(self, token: str, tool: str = "") -> Lookup:
        path = "/lookup/" + urllib.parse.quote(token, safe="")
        body = self._read_only("GET", path, None)
        found = body.get("found")
        if not isinstance(found, bool):
            raise ProviderError(f"{self.name}: lookup response has no boolean 'found'")
        if not found:
            return Lookup(found=False, result=None)
        return Lookup(found=True, result=_object(body.get("result"), "result", effectful=False))

    def describe(self, tool: str, target: str) -> ResourceDescription:
        body = self._read_only("POST", "/describe", {"tool": tool, "target": target})
        found, tenant = body.get("found"), body.get("tenant")
        if not isinstance(found, bool):
            raise ProviderError(f"{self.name}: describe response has no boolean 'found'")
        if tenant is not None and (not isinstance(tenant, str) or not tenant):
            raise ProviderError(f"{self.name}: describe 'tenant' must be a non-empty string")
        attributes = body.get("attributes", {})
        if not isinstance(attributes, dict):
            raise ProviderError(f"{self.name}: describe 'attributes' must be an object")
        return ResourceDescription(found, tenant if found else None, attributes)

    def _read_only(
        self, method: str, path: str, payload: Mapping[str, Any] | None
    ) -> dict[str, Any]:
        """A call without effect, repeated up to ``retries`` times on doubt."""
        for attempt in range(self.retries + 1):
            try:
                return self._call(method, path, payload, {}, effectful=False)
            except (ProviderError, ProviderTimeout) as exc:
                if attempt == self.retries or not _transient(exc):
                    raise
        raise AssertionError("unreachable")

    def _call(
        self,
        method: str,
        path: str,
        payload: Mapping[str, Any] | None,
        headers: Mapping[str, str],
        *,
        effectful: bool,
    ) -> dict[str, Any]:
        """One request; ``effectful`` marks execute, where doubt means "outcome unknown"."""
        data = None if payload is None else json.dumps(payload).encode()
        # The call's own token, before anything is sent (TokenExchangeFailed otherwise).
        auth = self._tokens.authorization() if self._tokens is not None else self._auth
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                **outgoing(),  # traced, the provider continues the call's trace
                **auth,
                **headers,
            },
        )
        where = f"{self.name} {method} {path}"
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            if effectful and exc.code == 504:
                raise ProviderTimeout(f"{where}: HTTP 504, outcome unknown") from exc
            raise ProviderError(f"{where}: HTTP {exc.code} {_snippet(exc)}") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise ProviderTimeout(f"{where}: timed out after {self.timeout_s}s") from exc
            if not effectful or isinstance(exc.reason, ConnectionRefusedError | socket.gaierror):
                raise ProviderError(f"{where}: {exc.reason}") from exc
            raise ProviderTimeout(f"{where}: {exc.reason}, outcome unknown") from exc
        except TimeoutError as exc:  # socket timeout while reading the response
            raise ProviderTimeout(f"{where}: timed out after {self.timeout_s}s") from exc
        except (OSError, http.client.HTTPException) as exc:
            if effectful:
                raise ProviderTimeout(f"{where}: {exc!r}, outcome unknown") from exc
            raise ProviderError(f"{where}: {exc!r}") from exc
        try:
            body = json.loads(raw)
        except ValueError as exc:
            if effectful:
                raise ProviderTimeout(f"{where}: unreadable response, outcome unknown") from exc
            raise ProviderError(f"{where}: unreadable response") from exc
        return _object(body, "response body", effectful=effectful)


def _transient(exc: Exception) -> bool:
    """A failure worth repeating: a timeout, no connection, or a 5xx answer (never a token
    the authorization server refused: asking again at once gets the same answer)."""
    if isinstance(exc, TokenExchangeFailed):
        return False
    if isinstance(exc, ProviderTimeout):
        return True
    cause = exc.__cause__
    if isinstance(cause, urllib.error.HTTPError):
        return cause.code >= 500
    return isinstance(cause, urllib.error.URLError | OSError)


def _object(value: Any, what: str, *, effectful: bool) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if effectful:  # a 2xx arrived, so the effect probably exists; let lookup decide
        raise ProviderTimeout(f"{what} is not a JSON object, outcome unknown")
    raise ProviderError(f"{what} is not a JSON object")


def _snippet(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read(200).decode("utf-8", "replace")
    except OSError:
        return ""
