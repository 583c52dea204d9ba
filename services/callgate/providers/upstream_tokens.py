"""Tokens for an upstream, obtained per call (issue 38.5, docs/adr/0081).

A provider configured with ``upstream_token`` sends its upstream a token its authorization
server (AS) issued for that upstream's audience and scopes, never a static secret and never
the caller's token:

- ``grant: token_exchange`` (RFC 8693): a token *for the user the call acts for*. The
  subject token is an assertion callgate signs of the verified principal (``sub`` the user,
  ``tenant``, ``act`` the session's delegation chain), short-lived and for the AS only;
  callgate authenticates at the AS as a client, which makes it the actor. The executor
  runs after the decision, possibly hours later after an approval, and holds only what the
  log says: the verified principal (``ExecutionRequested.actor``, ``agent``,
  ``delegation``), never a bearer token (those never reach the log).
- ``grant: client_credentials``: a token for callgate itself, for service-level upstreams.

Tokens are cached per subject and audience until ``refresh_before_s`` before they expire.
Any failure to obtain one raises ``TokenExchangeFailed`` before anything is sent to the
upstream: the executor records the call ``token_exchange_failed``. The OAuth requests are
Authlib's (``OAuth2Client`` on httpx: client authentication, form encoding, error replies).

Who a call acts for reaches the provider through ``acting_for`` (a context variable the
executor sets around each provider call), so that the provider interface stays as it is.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jwt
from pydantic import BaseModel, ConfigDict, Field, model_validator

from callgate.domain.keys import PrivateKey, algorithm_of
from callgate.providers.base import ProviderError
from callgate.providers.secrets import Secret

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:jwt"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
CACHED_TOKENS = 10_000  # (subject, audience) pairs kept; least recently used first out


@dataclass(frozen=True, slots=True)
class Acting:
    """Whom a provider call acts for: the verified principal the decider recorded."""

    user: str
    tenant: str
    agent: str = ""
    delegation: tuple[str, ...] = ()


_ACTING: ContextVar[Acting | None] = ContextVar("callgate_acting", default=None)


@contextmanager
def acting_for(who: Acting | None) -> Iterator[None]:
    """Provider calls inside act for ``who`` (``None``: for nobody, e.g. a record written
    before the principal was on the executor's requests: a token exchange then fails)."""
    reset = _ACTING.set(who)
    try:
        yield
    finally:
        _ACTING.reset(reset)


def acting() -> Acting | None:
    return _ACTING.get()


class TokenExchangeFailed(ProviderError):
    """The upstream's token could not be obtained; nothing was sent to the upstream."""


class SubjectAssertion(BaseModel):
    """The subject token callgate signs for a token exchange: the verified principal."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    issuer: str = Field(min_length=1, description="iss of the assertion; the AS trusts it")
    audience: str = Field(min_length=1, description="aud: the AS that reads it")
    key: Secret = Field(description="the signing key, a PEM private key (file)")
    kid: str = Field(min_length=1)
    ttl_s: int = Field(default=60, gt=0, le=600)
    # Further claims an AS requires of a subject token (Keycloak: ``typ: Bearer``); never
    # one callgate sets.
    claims: dict[str, str] = {}

    @model_validator(mode="after")
    def _own_claims(self) -> SubjectAssertion:
        taken = _ASSERTED & set(self.claims)
        if taken:
            raise ValueError(f"subject.claims may not set {', '.join(sorted(taken))}")
        return self


_ASSERTED = frozenset({"iss", "sub", "aud", "iat", "nbf", "exp", "jti", "tenant", "agent", "act"})


class UpstreamTokenConfig(BaseModel):
    """``upstream_token:`` of an ``http`` or ``mcp`` provider (docs/configuration.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    grant: Literal["token_exchange", "client_credentials"]
    token_endpoint: str = Field(pattern=r"^https?://[^\s/]+")
    client_id: str = Field(min_length=1)
    client_secret: Secret
    auth_method: Literal["client_secret_basic", "client_secret_post"] = "client_secret_basic"
    audience: str = Field(min_length=1, description="the upstream's audience at the AS")
    scopes: tuple[str, ...] = ()
    resource: str | None = Field(default=None, description="RFC 8707 resource indicator")
    # Further form parameters the AS needs (Keycloak's ``subject_issuer``); never the ones
    # callgate sets.
    parameters: dict[str, str] = {}
    subject: SubjectAssertion | None = None
    timeout_s: float = Field(default=10.0, gt=0, le=120)
    refresh_before_s: int = Field(default=30, ge=0, le=3600)

    @model_validator(mode="after")
    def _subject_for_exchange(self) -> UpstreamTokenConfig:
        if self.grant == "token_exchange" and self.subject is None:
            raise ValueError("grant token_exchange needs 'subject' (the assertion callgate signs)")
        if self.grant == "client_credentials" and self.subject is not None:
            raise ValueError("grant client_credentials takes no 'subject'")
        reserved = _RESERVED & set(self.parameters)
        if reserved:
            raise ValueError(f"parameters may not set {', '.join(sorted(reserved))}")
        return self


_RESERVED = frozenset(
    {
        "grant_type",
        "subject_token",
        "subject_token_type",
        "actor_token",
        "actor_token_type",
        "requested_token_type",
        "audience",
        "scope",
        "resource",
        "client_id",
        "client_secret",
    }
)


def subject_assertion(who: Acting, config: SubjectAssertion, key: PrivateKey, now_s: float) -> str:
    """The signed assertion of ``who``: ``sub`` the user, ``tenant``, and the session's
    delegation chain as a nested ``act`` (RFC 8693 4.1), the current actor outermost."""
    iat = int(now_s)
    claims: dict[str, Any] = {
        **config.claims,
        "iss": config.issuer,
        "sub": who.user,
        "aud": config.audience,
        "iat": iat,
        "nbf": iat,
        "exp": iat + config.ttl_s,
        "jti": uuid.uuid4().hex,
        "tenant": who.tenant,
    }
    if who.agent:
        claims["agent"] = who.agent
    act: dict[str, Any] | None = None
    for actor in reversed(who.delegation):
        act = {"sub": actor} if act is None else {"sub": actor, "act": act}
    if act is not None:
        claims["act"] = act
    return jwt.encode(
        claims, key, algorithm=algorithm_of(key), headers={"kid": config.kid, "typ": "JWT"}
    )


class UpstreamTokens:
    """The tokens of one provider's upstream, obtained and cached (module docstring)."""

    def __init__(
        self,
        provider: str,
        config: UpstreamTokenConfig,
        client_secret: str,
        subject_key: PrivateKey | None,
        clock: Callable[[], float] = time.time,
        cache_size: int = CACHED_TOKENS,
    ) -> None:
        if config.grant == "token_exchange" and subject_key is None:
            raise ValueError("token_exchange needs the subject assertion's key")
        self.provider = provider
        self.config = config
        self._secret = client_secret
        self._key = subject_key
        self._clock = clock
        self._cache: OrderedDict[tuple[Any, ...], tuple[str, float]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never the secret
        return f"UpstreamTokens({self.provider!r}, {self.config.grant!r})"

    def authorization(self) -> dict[str, str]:
        """The ``Authorization`` header for the current call (``acting``)."""
        return {"Authorization": f"Bearer {self.token()}"}

    def token(self) -> str:
        """A token for the upstream, for the user the current call acts for (token
        exchange) or for callgate (client credentials); ``TokenExchangeFailed`` when none
        can be had."""
        cfg = self.config
        who = acting() if cfg.grant == "token_exchange" else None
        if cfg.grant == "token_exchange" and who is None:
            raise TokenExchangeFailed(
                f"{self.provider}: no verified user for this call: a token exchange needs one"
            )
        key = (who, cfg.audience, cfg.scopes, cfg.resource)
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and now < cached[1]:
                self._cache.move_to_end(key)
                return cached[0]
        token, expires_in = self._fetch(who, now)
        if expires_in is not None and expires_in > cfg.refresh_before_s:
            with self._lock:
                self._cache[key] = (token, now + expires_in - cfg.refresh_before_s)
                self._cache.move_to_end(key)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return token

    def _fetch(self, who: Acting | None, now: float) -> tuple[str, float | None]:
        from authlib.integrations.httpx_client import OAuth2Client

        cfg = self.config
        form: dict[str, Any] = dict(cfg.parameters)
        form["audience"] = cfg.audience
        if cfg.scopes:
            form["scope"] = " ".join(cfg.scopes)
        if cfg.resource is not None:
            form["resource"] = cfg.resource
        if who is not None:
            assert cfg.subject is not None and self._key is not None
            grant = TOKEN_EXCHANGE
            form["subject_token"] = subject_assertion(who, cfg.subject, self._key, now)
            form["subject_token_type"] = JWT_TOKEN_TYPE
            form["requested_token_type"] = ACCESS_TOKEN_TYPE
        else:
            grant = "client_credentials"
        where = f"{self.provider}: {cfg.grant} at {cfg.token_endpoint}"
        try:
            with OAuth2Client(
                cfg.client_id,
                self._secret,
                token_endpoint_auth_method=cfg.auth_method,
                timeout=cfg.timeout_s,
                follow_redirects=False,
                trust_env=False,
            ) as client:
                answer = client.fetch_token(cfg.token_endpoint, grant_type=grant, **form)
        except Exception as exc:  # any failure: no token, nothing sent upstream
            raise TokenExchangeFailed(f"{where} failed: {_reason(exc)}") from exc
        token = answer.get("access_token")
        if not isinstance(token, str) or not token:
            raise TokenExchangeFailed(f"{where} failed: the answer has no access_token")
        issued = answer.get("issued_token_type")
        if who is not None and issued not in (None, ACCESS_TOKEN_TYPE):
            raise TokenExchangeFailed(f"{where} failed: issued {issued!r}, not an access token")
        expires_in = answer.get("expires_in")
        valid = isinstance(expires_in, int | float) and not isinstance(expires_in, bool)
        return token, float(expires_in) if valid else None


def _reason(exc: Exception) -> str:
    """Why the AS gave no token, bounded: its OAuth error, else the failure's kind."""
    error = getattr(exc, "error", None)
    description = getattr(exc, "description", None)
    if isinstance(error, str):
        return f"{error}: {description}" if description else error
    return f"{type(exc).__name__}: {exc}"[:300]


def build_upstream_tokens(
    provider: str, config: UpstreamTokenConfig, environ: Mapping[str, str], base: Path
) -> UpstreamTokens:
    """The provider's ``UpstreamTokens`` from its settings (``ValueError`` naming what is
    missing: a secret not set, a key that does not load)."""
    secret = config.client_secret.read(environ, base)
    key = None
    if config.subject is not None:
        if config.subject.key.file is None:
            raise ValueError("upstream_token.subject.key: give the PEM private key as 'file'")
        key = _private_key(config.subject.key.path(base))
    return UpstreamTokens(provider, config, secret, key)


def _private_key(path: Path) -> PrivateKey:
    """An unencrypted PEM private key of an accepted kind (EdDSA, ES256, RS256)."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ValueError(f"upstream_token.subject.key: cannot load {path}: {exc}") from None
    if not isinstance(key, PrivateKey):
        raise ValueError(f"upstream_token.subject.key: {path}: unsupported key type")
    algorithm_of(key)  # RSA under 2048 bits, another curve: ValueError naming why
    return key
