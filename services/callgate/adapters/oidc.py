"""OpenID Connect for the console's sign-in (ADR 0031): discovery, the provider's keys,
and the authorization code flow with PKCE, through Authlib.

An adapter: the composition root builds it from ``[[sessions.issuers]]`` entries with a
``client_id``; the HTTP surface asks it for the provider's authorization URL and to
redeem the code. It decides nothing about who signed in: the ID token it returns is
verified by the same ``SessionVerifier`` as every bearer token (C6).
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from authlib.common.security import generate_token
from authlib.integrations.httpx_client import OAuth2Client

from callgate.config.sections import IssuerSettings

DISCOVERY_PATH = "/.well-known/openid-configuration"
TIMEOUT_S = 10.0


class SignInError(ValueError):
    """The provider's answer cannot sign anyone in (the message says why)."""


@dataclass(frozen=True)
class ProviderMetadata:
    """What callgate uses of a provider's discovery document."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str


def _get_json(url: str) -> Any:
    try:
        response = httpx.get(url, timeout=TIMEOUT_S, headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise OSError(f"{url}: {exc}") from None
    if response.status_code != 200:
        raise OSError(f"{url}: HTTP {response.status_code}")
    try:
        return response.json()
    except ValueError:
        raise ValueError(f"{url}: not JSON") from None


class Discovery:
    """Each provider's discovery document and keys, fetched once (at start) and kept."""

    def __init__(self) -> None:
        self._metadata: dict[str, ProviderMetadata] = {}
        self._lock = threading.Lock()

    def metadata(self, entry: IssuerSettings) -> ProviderMetadata:
        with self._lock:
            found = self._metadata.get(entry.issuer)
            if found is None:
                found = self._metadata[entry.issuer] = _discover(entry.issuer)
            return found

    def keys(self, entry: IssuerSettings) -> Mapping[str, Any]:
        """The JWKS document at the provider's ``jwks_uri`` (the configured one, else the
        discovery document's), fetched now."""
        doc = _get_json(entry.jwks_uri or self.metadata(entry).jwks_uri)
        if not isinstance(doc, dict):
            raise ValueError("the jwks_uri document is not a JSON object")
        return doc


def _discover(issuer: str) -> ProviderMetadata:
    doc = _get_json(issuer.rstrip("/") + DISCOVERY_PATH)
    if not isinstance(doc, dict):
        raise ValueError("the discovery document is not a JSON object")
    # OpenID Connect Discovery 1.0, 4.3: the document's issuer is exactly the one asked.
    if doc.get("issuer") != issuer:
        raise ValueError(f"the discovery document names issuer {doc.get('issuer')!r}")
    fields = ("authorization_endpoint", "token_endpoint", "jwks_uri")
    missing = [f for f in fields if not isinstance(doc.get(f), str)]
    if missing:
        raise ValueError(f"the discovery document lacks {', '.join(missing)}")
    methods = doc.get("code_challenge_methods_supported")
    if isinstance(methods, list) and "S256" not in methods:
        raise ValueError("the provider does not support PKCE with S256")
    return ProviderMetadata(issuer, *(str(doc[f]) for f in fields))


@dataclass(frozen=True)
class Transaction:
    """One sign-in in progress, kept by the browser in a short-lived HttpOnly cookie
    between the redirect to the provider and the callback (so that any instance can
    finish it): the provider's index, ``state``, ``nonce`` and the PKCE verifier."""

    provider: int
    state: str
    nonce: str
    verifier: str

    def encode(self) -> str:
        return f"{self.provider}.{self.state}.{self.nonce}.{self.verifier}"

    @classmethod
    def decode(cls, text: str | None) -> Transaction | None:
        parts = (text or "").split(".")
        if len(parts) != 4 or not parts[0].isdigit() or not all(parts[1:]):
            return None
        return cls(int(parts[0]), parts[1], parts[2], parts[3])


class OidcSignIn:
    """One provider the console signs approvers in with (authorization code + PKCE)."""

    def __init__(self, index: int, entry: IssuerSettings, discovery: Discovery) -> None:
        assert entry.client_id is not None and entry.redirect_uri is not None
        self.index = index
        self.issuer = entry.issuer
        self.name = entry.name or entry.issuer
        self._entry = entry
        self._discovery = discovery

    def _client(self) -> OAuth2Client:
        entry = self._entry
        return OAuth2Client(
            client_id=entry.client_id,
            client_secret=entry.client_secret,
            scope=" ".join(entry.scopes),
            redirect_uri=entry.redirect_uri,
            code_challenge_method="S256",
            token_endpoint_auth_method="client_secret_basic" if entry.client_secret else "none",
            timeout=TIMEOUT_S,
        )

    def begin(self) -> tuple[str, Transaction]:
        """The provider's authorization URL and the transaction the browser keeps."""
        tx = Transaction(self.index, generate_token(32), generate_token(32), generate_token(64))
        endpoint = self._discovery.metadata(self._entry).authorization_endpoint
        with self._client() as client:
            url, _ = client.create_authorization_url(
                endpoint, state=tx.state, code_verifier=tx.verifier, nonce=tx.nonce
            )
        return str(url), tx

    def finish(self, tx: Transaction, params: Mapping[str, str]) -> str:
        """The ID token for the callback's ``params``. Raises ``SignInError``."""
        if "error" in params:
            raise SignInError(f"the provider refused: {params['error']}")
        state, code = params.get("state", ""), params.get("code", "")
        if not code or not hmac.compare_digest(state.encode(), tx.state.encode()):
            raise SignInError("the callback does not belong to this browser's sign-in")
        # RFC 9207: a provider that names itself must be the one this sign-in went to.
        if "iss" in params and params["iss"] != self.issuer:
            raise SignInError("the callback comes from another issuer")
        endpoint = self._discovery.metadata(self._entry).token_endpoint
        try:
            with self._client() as client:
                token = client.fetch_token(
                    endpoint,
                    grant_type="authorization_code",
                    code=code,
                    code_verifier=tx.verifier,
                )
        except Exception as exc:  # Authlib's OAuthError, httpx's errors: all refuse
            raise SignInError(f"the token endpoint refused the code: {exc}") from None
        id_token = token.get("id_token")
        if not isinstance(id_token, str) or not id_token:
            raise SignInError("the provider returned no ID token (is 'openid' in scopes?)")
        return id_token
