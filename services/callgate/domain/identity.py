"""Session identity (C6): who acts comes from a signed session token, never from arguments.

Pure given keys and ``now_ms``: token signatures are checked by ``keys.decode_signed``
(which reads no clock) and every time claim is compared here against ``now_ms``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import jwt

from callgate.domain.codes import Code, Rejection
from callgate.domain.keys import (
    ALGORITHM,
    ALGORITHMS,
    PrivateKey,
    PublicKey,
    SignatureError,
    algorithm_of,
    decode_signed,
)
from callgate.domain.principal import Principal, canonical_problem, fold_identity, looks_alike

DEV_ISSUER = "callgate-dev"
AUDIENCE = "callgate"
# Claims every session token must carry; ``nbf`` and ``sid`` are checked when present
# so that tokens from a platform issuer that omits them still verify.
REQUIRED_CLAIMS = ("sub", "tenant", "roles", "iat", "exp", "iss", "aud")
MAX_ARGS_DEPTH = 64  # deeper arguments are refused rather than walked
MAX_NUMERIC_DATE = 253_402_300_799  # 9999-12-31T23:59:59Z: later (or earlier) dates are refused


class SessionIssuer:
    """The development issuer behind ``callgate session issue``."""

    def __init__(
        self,
        key: PrivateKey,
        kid: str,
        issuer: str = DEV_ISSUER,
        audience: str = AUDIENCE,
    ) -> None:
        self._key = key
        self._kid = kid
        self._issuer = issuer
        self._audience = audience

    def issue(
        self,
        user: str,
        tenant: str,
        roles: tuple[str, ...] | list[str],
        now_ms: int,
        ttl_seconds: int = 3600,
        session_id: str | None = None,
    ) -> str:
        if not user or not tenant:
            raise ValueError("user and tenant must be non-empty")
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        iat = now_ms // 1000
        claims: dict[str, Any] = {
            "sub": user,
            "tenant": tenant,
            "roles": list(roles),
            "iat": iat,
            "nbf": iat,
            "exp": iat + ttl_seconds,
            "iss": self._issuer,
            "aud": self._audience,
        }
        claims["sid"] = session_id or _derived_session_id(claims)
        alg = algorithm_of(self._key)
        return jwt.encode(claims, self._key, algorithm=alg, headers={"kid": self._kid})


def token_digest(token: str) -> str | None:
    """What the event log records of a bearer token: ``sha256:<hex>``, never the token.

    Enough to tell which token authorized a call (an operator who holds the token can
    compute it) and useless to present as a session; ``None`` for an empty token.
    """
    if not token:
        return None
    return "sha256:" + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _derived_session_id(claims: Mapping[str, Any]) -> str:
    canonical = json.dumps(claims, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "s-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]


@dataclass(frozen=True)
class TrustedIssuer:
    """One identity provider whose session tokens callgate accepts (``callgate.toml``).

    A token is checked against the issuer that owns the ``kid`` in its header: the
    signature with that issuer's keys and ``algorithms``, then ``iss`` must be
    ``issuer``, ``aud`` must contain ``audience``, and time claims get ``leeway_ms``
    (the clock skew allowed between the identity provider and callgate).
    """

    issuer: str
    audience: str
    keys: Mapping[str, PublicKey]
    algorithms: tuple[str, ...] = (ALGORITHM,)
    leeway_ms: int = 0
    frozen_keys: Mapping[str, PublicKey] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "frozen_keys", MappingProxyType(dict(self.keys)))


class SessionVerifier:
    """Turns a session token into the ``Principal`` (C6); anything doubtful is refused."""

    def __init__(
        self,
        keys: Mapping[str, PublicKey],
        issuer: str | tuple[str, ...] = DEV_ISSUER,
        audience: str = AUDIENCE,
        leeway_ms: int = 0,
        cache_size: int = 4096,
        *,
        trusted: Sequence[TrustedIssuer] = (),
    ) -> None:
        """``keys`` (with ``issuer``, ``audience``, ``leeway_ms``) is one EdDSA issuer, the
        development one by default; ``trusted`` adds configured issuers. No kid may
        belong to two issuers (``ValueError``): the kid picks the issuer."""
        names = (issuer,) if isinstance(issuer, str) else tuple(issuer)
        if keys and not names:
            raise ValueError("keys need an issuer name")
        # The keys-argument issuer may go by several names (one key set): any of them.
        self._by_kid: dict[str, tuple[TrustedIssuer, tuple[str, ...]]] = {}
        if keys:
            own = TrustedIssuer(names[0], audience, keys, (ALGORITHM,), leeway_ms)
            self._by_kid.update((kid, (own, names)) for kid in keys)
        for entry in trusted:
            for kid in entry.keys:
                if kid in self._by_kid:
                    raise ValueError(f"key id {kid!r} belongs to two session issuers")
                self._by_kid[kid] = (entry, (entry.issuer,))
        # Signature verification is a pure function of (token, keys): an agent session sends
        # many calls with one token, so remember verified claims (never failures, never time
        # checks, which run on every call). Bounded; the oldest entry goes first.
        self._verified: OrderedDict[str, tuple[dict[str, Any], str]] = OrderedDict()
        self._cache_size = cache_size
        self._development_off = False

    @classmethod
    def of_issuers(
        cls, trusted: Sequence[TrustedIssuer], cache_size: int = 4096
    ) -> SessionVerifier:
        """A verifier trusting exactly ``trusted`` (none: every token is refused), outside
        development mode: a development token is refused saying so."""
        verifier = cls({}, (), cache_size=cache_size, trusted=trusted)
        verifier._development_off = True
        return verifier

    @property
    def issuers(self) -> tuple[str, ...]:
        """The trusted issuer names, each once, in order."""
        return tuple(dict.fromkeys(n for _, names in self._by_kid.values() for n in names))

    def _claims(self, token: str) -> tuple[dict[str, Any], str]:
        """Verified claims and the kid that verified them."""
        cached = self._verified.get(token)
        if cached is not None:
            self._verified.move_to_end(token)
            return cached
        try:
            header = jwt.get_unverified_header(token) if isinstance(token, str) and token else {}
        except (jwt.PyJWTError, ValueError):  # UnicodeError too: decode_signed names why
            header = {}
        kid = header.get("kid")
        entry = self._by_kid.get(kid) if isinstance(kid, str) else None
        if entry is None and self._development_off and _unverified_issuer(token) == DEV_ISSUER:
            # Not a key problem: the development issuer is not trusted outside dev mode.
            raise Rejection(
                Code.UNAUTHENTICATED,
                DEV_MODE_OFF,
                {"reason": "development mode is off"},
            )
        # An unknown kid gets every algorithm, so that the refusal names the kid.
        keys, algorithms = (
            (entry[0].frozen_keys, entry[0].algorithms) if entry else ({}, ALGORITHMS)
        )
        try:
            _, claims = decode_signed(token, keys, algorithms=algorithms)
        except SignatureError as e:
            raise _unauthenticated(e.reason) from None
        verified = (claims, str(kid))
        self._verified[token] = verified
        if len(self._verified) > self._cache_size:
            self._verified.popitem(last=False)
        return verified

    def verify_with_claims(self, token: str, now_ms: int) -> tuple[Principal, Mapping[str, Any]]:
        """``verify``, and the token's verified claims (an OpenID Connect sign-in checks
        its ``nonce`` there)."""
        principal = self.verify(token, now_ms)
        return principal, MappingProxyType(dict(self._claims(token)[0]))

    def verify(self, token: str, now_ms: int) -> Principal:
        """Raise ``Rejection(UNAUTHENTICATED, reason)`` unless ``token`` is valid at ``now_ms``."""
        claims, kid = self._claims(token)
        issuer, names = self._by_kid[kid]
        missing = [c for c in REQUIRED_CLAIMS if c not in claims]
        if missing:
            raise _unauthenticated(f"missing claims: {', '.join(missing)}")
        if claims["iss"] not in names:
            raise _unauthenticated(f"wrong issuer {claims['iss']!r}")
        aud = claims["aud"]
        audiences = aud if isinstance(aud, list) else [aud]
        if issuer.audience not in audiences:
            raise _unauthenticated(f"wrong audience {aud!r}")
        leeway = issuer.leeway_ms
        # Floor the end and ceil the starts: rounding never widens the validity window.
        exp_ms = _numeric_date_ms(claims, "exp", math.floor)
        iat_ms = _numeric_date_ms(claims, "iat", math.ceil)
        nbf_ms = _numeric_date_ms(claims, "nbf", math.ceil) if "nbf" in claims else None
        if now_ms >= exp_ms + leeway:
            raise _unauthenticated("token expired")
        if nbf_ms is not None and now_ms + leeway < nbf_ms:
            raise _unauthenticated("token not yet valid (nbf)")
        if now_ms + leeway < iat_ms:
            raise _unauthenticated("token issued in the future (iat)")
        user, tenant, roles = claims["sub"], claims["tenant"], claims["roles"]
        if not isinstance(user, str) or not user:
            raise _unauthenticated("claim 'sub' must be a non-empty string")
        if not isinstance(tenant, str) or not tenant:
            raise _unauthenticated("claim 'tenant' must be a non-empty string")
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise _unauthenticated("claim 'roles' must be a list of strings")
        sid = claims.get("sid", "")
        if not isinstance(sid, str):
            raise _unauthenticated("claim 'sid' must be a string")
        agent_claim, agent = _agent(claims)
        for text in (user, tenant, sid, agent, *roles):
            if not _valid_text(text):
                raise _unauthenticated("a claim is not valid Unicode or is too long")
        # Canonical at the boundary, exact everywhere after (docs/contract.md, "Identity
        # normalization"): nothing is rewritten, a claim not already canonical is refused.
        named = (("sub", user), ("tenant", tenant), *(("roles", r) for r in roles))
        if agent_claim:
            named = (*named, (agent_claim, agent))
        for name, value in named:
            if (problem := canonical_problem(value)) is not None:
                raise _unauthenticated(f"claim {name!r} {problem}: {value!r}")
        return Principal(
            user=user,
            tenant=tenant,
            roles=tuple(dict.fromkeys(roles)),
            session_id=sid,
            expires_at=exp_ms,
            agent=agent,
        )


AGENT_CLAIMS = ("azp", "client_id")  # the agent: the first of these the token carries


def _agent(claims: Mapping[str, Any]) -> tuple[str, str]:
    """The claim naming the agent (the client acting for the user) and its value, or
    ``("", "")`` when the token names none. ``azp`` (OpenID Connect) wins over
    ``client_id`` (RFC 9068): a present claim that is not a string is refused, never
    skipped for the next one."""
    for name in AGENT_CLAIMS:
        if name in claims:
            value = claims[name]
            if not isinstance(value, str):
                raise _unauthenticated(f"claim {name!r} must be a string")
            return name, value
    return "", ""


MAX_CLAIM_CHARS = 256  # user, tenant, role and session names longer than this are refused


def _valid_text(value: str) -> bool:
    """Names that every record can carry: valid Unicode (no lone surrogate), bounded."""
    if len(value) > MAX_CLAIM_CHARS:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


DEV_MODE_OFF = "development session token: development mode is off (use --dev or CALLGATE_DEV=1)"


def _unverified_issuer(token: str) -> object:
    """The ``iss`` claim before any signature check: only to word a refusal."""
    try:
        payload = jwt.PyJWS().decode_complete(token, options={"verify_signature": False})
        claims = json.loads(payload["payload"])
    except (jwt.PyJWTError, ValueError, TypeError, KeyError):
        return None
    return claims.get("iss") if isinstance(claims, dict) else None


def _unauthenticated(reason: str) -> Rejection:
    return Rejection(Code.UNAUTHENTICATED, f"invalid session token: {reason}", {"reason": reason})


def _numeric_date_ms(claims: Mapping[str, Any], name: str, rounding: Callable[[float], int]) -> int:
    value = claims[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _unauthenticated(f"claim {name!r} must be a number")
    # A signed but strange date (1e308, 10**400) must be refused, not overflow the decider.
    if abs(value) > MAX_NUMERIC_DATE:
        raise _unauthenticated(f"claim {name!r} is out of range")
    return int(rounding(value * 1000))


# --- C6: identity fields in arguments ----------------------------------------------------


def check_identity(
    spec_identity_args: tuple[str, ...],
    tenant_fields: tuple[str, ...],
    args: Mapping[str, Any],
    principal: Principal,
) -> dict[str, Any]:
    """C6: every identity field anywhere in ``args`` must name the session's user/tenant.

    Walks dicts and lists at any depth. A key that is, or folds to (``fold_identity``),
    one of ``spec_identity_args`` names the acting user; one of ``tenant_fields`` names a
    tenant. Its value must equal the session's identifier exactly: any other value,
    another spelling of it included, raises ``Rejection(IDENTITY_SPOOF, ...,
    {"field": "dotted.path"})``. Any other string that is not a session identifier but
    folds together with one (``ALICE``, full-width ``alice``, a Cyrillic look-alike) is refused
    the same way, with ``details.reason`` ``look-alike``: folding only ever denies.
    Returns a copy of ``args``.
    """
    user_keys = frozenset(fold_identity(k) for k in spec_identity_args)
    tenant_keys = frozenset(fold_identity(k) for k in tenant_fields)
    mine = (principal.user, principal.tenant)

    def walk(value: Any, path: str, depth: int) -> Any:
        if depth > MAX_ARGS_DEPTH:
            raise Rejection(Code.INVALID_ARGUMENTS, "arguments nested too deeply", {"field": path})
        if isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                item_path = f"{path}.{key}" if path else str(key)
                name = fold_identity(key) if isinstance(key, str) else None
                if name in user_keys:
                    out[key] = _expect(item, principal.user, "user", item_path)
                elif name in tenant_keys:
                    out[key] = _expect(item, principal.tenant, "tenant", item_path)
                else:
                    out[key] = walk(item, item_path, depth + 1)
            return out
        if isinstance(value, list | tuple):
            return [
                walk(item, f"{path}.{i}" if path else str(i), depth + 1)
                for i, item in enumerate(value)
            ]
        if isinstance(value, str) and value not in mine and len(value) <= MAX_CLAIM_CHARS:
            for who in mine:
                if looks_alike(value, who):
                    raise Rejection(
                        Code.IDENTITY_SPOOF,
                        f"argument {path!r} names a look-alike of the session's identity",
                        {"field": path, "reason": "look-alike"},
                    )
        return value

    result: dict[str, Any] = walk(args, "", 0)
    return result


def _expect(value: Any, session_value: str, kind: str, path: str) -> str:
    if not isinstance(value, str) or value != session_value:
        raise Rejection(
            Code.IDENTITY_SPOOF,
            f"argument {path!r} names a {kind} other than the session's",
            {"field": path},
        )
    return session_value


__all__ = [
    "AUDIENCE",
    "DEV_ISSUER",
    "MAX_ARGS_DEPTH",
    "REQUIRED_CLAIMS",
    "SessionIssuer",
    "SessionVerifier",
    "canonical_problem",
    "check_identity",
    "fold_identity",
    "looks_alike",
]
