"""Session identity (C6): who acts comes from a signed session token, never from arguments.

Pure given keys and ``now_ms``: token signatures are checked by ``keys.decode_signed``
(which reads no clock) and every time claim is compared here against ``now_ms``.
The identity fields of a call's arguments are checked against the verified principal by
``identity_args``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from callgate.domain.claims import (
    MISSING,
    UNBOUND,
    Binding,
    ClaimPath,
    ClaimsMapping,
    path_text,
    read,
)
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
# Claims every session token must carry (the default claims mapping); ``nbf`` and ``sid``
# are checked when present so that tokens from a platform issuer that omits them still
# verify. Where an issuer's user, tenant and roles are: its ``ClaimsMapping``.
REQUIRED_CLAIMS = ("sub", "tenant", "roles", "iat", "exp", "iss", "aud")
TIME_AND_ORIGIN_CLAIMS = ("iat", "exp", "iss", "aud")
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
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """A signed session token; ``extra`` adds claims (``azp``, ``act``) as a provider's
        token would carry them, never replacing the ones set here."""
        if not user or not tenant:
            raise ValueError("user and tenant must be non-empty")
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        iat = now_ms // 1000
        claims: dict[str, Any] = {
            **(extra or {}),
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
        import jwt  # where used: start-up (module docstring of callgate.domain.keys)

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


class KeySet(Protocol):
    """An issuer's keys that change while callgate runs (its ``jwks_uri``), kept by an
    adapter that fetches them: the verifier only reads them and asks for a refresh."""

    def current(self) -> Mapping[str, PublicKey]:
        """The keys to verify with now (none once they are older than the adapter allows:
        every token is refused rather than verified with keys that may be revoked)."""
        ...

    def refresh(self) -> bool:
        """Fetch the keys again for a ``kid`` they lack, if the adapter's rate limit lets
        it; whether they were fetched. Never raises."""
        ...


@dataclass(frozen=True)
class TrustedIssuer:
    """One identity provider whose session tokens callgate accepts (``callgate.toml``).

    A token is checked against the issuer that owns the ``kid`` in its header: the
    signature with that issuer's keys and ``algorithms``, then ``iss`` must be
    ``issuer``, ``aud`` must contain ``audience``, and time claims get ``leeway_ms``
    (the clock skew allowed between the identity provider and callgate). ``claims`` says
    where the user, tenant and roles are; ``binding`` what this issuer may assert.
    ``key_set``, when given, replaces ``keys``: keys fetched and rotated by an adapter.
    """

    issuer: str
    audience: str
    keys: Mapping[str, PublicKey]
    algorithms: tuple[str, ...] = (ALGORITHM,)
    leeway_ms: int = 0
    claims: ClaimsMapping = field(default_factory=ClaimsMapping)
    binding: Binding = field(default_factory=Binding)
    key_set: KeySet | None = field(default=None, compare=False)
    frozen_keys: Mapping[str, PublicKey] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "frozen_keys", MappingProxyType(dict(self.keys)))

    def current_keys(self) -> Mapping[str, PublicKey]:
        """The keys that verify this issuer's tokens now."""
        return self.key_set.current() if self.key_set is not None else self.frozen_keys


# (issuer, the names its ``iss`` may take, the key that verified): whom a kid belongs to.
_Owner = tuple[TrustedIssuer, tuple[str, ...], PublicKey]


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
        # The keys-argument issuer may go by several names (one key set): any of them. It
        # is the development issuer (or a test's): unbound, it asserts what it is asked.
        self._by_kid: dict[str, _Owner] = {}
        if keys:
            own = TrustedIssuer(names[0], audience, keys, (ALGORITHM,), leeway_ms, binding=UNBOUND)
            self._by_kid.update((kid, (own, names, key)) for kid, key in own.frozen_keys.items())
        # Issuers whose keys rotate: looked up on every token (their keys change).
        self._rotating = tuple(e for e in trusted if e.key_set is not None)
        for entry in trusted:
            for kid, key in entry.current_keys().items():
                if kid in self._by_kid or self._rotating_owners(kid, entry):
                    raise ValueError(f"key id {kid!r} belongs to two session issuers")
                if entry.key_set is None:
                    self._by_kid[kid] = (entry, (entry.issuer,), key)
        # Signature verification is a pure function of (token, key): an agent session sends
        # many calls with one token, so remember verified claims with the key that verified
        # them (never failures, never time checks, which run on every call); a hit counts
        # only while that key still belongs to that issuer. Bounded; oldest first out. The
        # header's kid is kept too: PyJWT's header parse checks every character of the
        # token in Python, a tenth of a decider's CPU when it ran on every call.
        self._verified: OrderedDict[str, tuple[dict[str, Any], _Owner, str]] = OrderedDict()
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
        static = (n for _, names, _ in self._by_kid.values() for n in names)
        return tuple(dict.fromkeys((*static, *(e.issuer for e in self._rotating))))

    def _rotating_owners(self, kid: str, but: TrustedIssuer | None = None) -> list[_Owner]:
        owners: list[_Owner] = []
        for entry in self._rotating:
            key = entry.current_keys().get(kid)
            if key is not None and entry is not but:
                owners.append((entry, (entry.issuer,), key))
        return owners

    def _owner(self, kid: str) -> _Owner | None:
        """The issuer and key a kid names now; a kid two issuers claim names neither."""
        owners = self._rotating_owners(kid)
        static = self._by_kid.get(kid)
        if static is not None:
            owners.append(static)
        if len(owners) > 1:
            raise _unauthenticated(f"key id {kid!r} belongs to two session issuers")
        return owners[0] if owners else None

    def _owner_refreshed(self, kid: str, token: str) -> _Owner | None:
        """``_owner``, after asking the issuer the token names to fetch its keys again when
        none holds the kid. Only a configured issuer is asked (never one a token makes up),
        and its adapter limits how often."""
        owner = self._owner(kid)
        if owner is not None or not self._rotating:
            return owner
        claimed = _unverified_issuer(token)
        for entry in self._rotating:
            if entry.issuer == claimed and entry.key_set is not None and entry.key_set.refresh():
                return self._owner(kid)
        return None

    def _claims(self, token: str) -> tuple[dict[str, Any], _Owner]:
        """Verified claims and the issuer (with the key) that verified them."""
        cached = self._verified.get(token)
        if cached is not None:
            claims, owner, cached_kid = cached
            now = self._owner(cached_kid)
            if now is not None and now[0] is owner[0] and now[2] is owner[2]:
                self._verified.move_to_end(token)
                return claims, owner
            del self._verified[token]  # its key rotated out (or moved): verify again
        kid = _header_kid(token)
        entry = self._owner_refreshed(kid, token) if kid is not None else None
        if entry is None and self._development_off and _unverified_issuer(token) == DEV_ISSUER:
            # Not a key problem: the development issuer is not trusted outside dev mode.
            raise Rejection(
                Code.UNAUTHENTICATED,
                DEV_MODE_OFF,
                {"reason": "development mode is off"},
            )
        # An unknown kid gets every algorithm, so that the refusal names the kid.
        keys: Mapping[str, PublicKey] = {}
        algorithms: tuple[str, ...] = ALGORITHMS
        if entry is not None:
            keys, algorithms = {str(kid): entry[2]}, tuple(entry[0].algorithms)
        try:
            _, claims = decode_signed(token, keys, algorithms=algorithms)
        except SignatureError as e:
            raise _unauthenticated(e.reason) from None
        assert entry is not None and kid is not None  # decode_signed refuses a kid without a key
        self._verified[token] = (claims, entry, kid)
        if len(self._verified) > self._cache_size:
            self._verified.popitem(last=False)
        return claims, entry

    def verify_with_claims(self, token: str, now_ms: int) -> tuple[Principal, Mapping[str, Any]]:
        """``verify``, and the token's verified claims (an OpenID Connect sign-in checks
        its ``nonce`` there)."""
        principal = self.verify(token, now_ms)
        return principal, MappingProxyType(dict(self._claims(token)[0]))

    def verify(self, token: str, now_ms: int) -> Principal:
        """Raise ``Rejection(UNAUTHENTICATED, reason)`` unless ``token`` is valid at ``now_ms``
        and asserts no more than its issuer may (``Binding``)."""
        claims, (issuer, names, _) = self._claims(token)
        mapping = issuer.claims
        wanted: list[ClaimPath] = [mapping.subject]
        if mapping.tenant_constant is None:
            wanted.append(mapping.tenant)
        if mapping.roles_required:
            wanted.append(mapping.roles)
        wanted += [(c,) for c in TIME_AND_ORIGIN_CLAIMS]
        missing = [path_text(p) for p in wanted if read(claims, p) is MISSING]
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
        sub_name, tenant_name, roles_name = (
            path_text(mapping.subject),
            path_text(mapping.tenant),
            path_text(mapping.roles),
        )
        user = read(claims, mapping.subject)
        tenant = (
            mapping.tenant_constant
            if mapping.tenant_constant is not None
            else read(claims, mapping.tenant)
        )
        values = read(claims, mapping.roles)
        values = [] if values is MISSING else values
        if not isinstance(user, str) or not user:
            raise _unauthenticated(f"claim {sub_name!r} must be a non-empty string")
        if not isinstance(tenant, str) or not tenant:
            raise _unauthenticated(f"claim {tenant_name!r} must be a non-empty string")
        if not isinstance(values, list) or not all(isinstance(r, str) for r in values):
            raise _unauthenticated(f"claim {roles_name!r} must be a list of strings")
        sid = claims.get("sid", "")
        if not isinstance(sid, str):
            raise _unauthenticated("claim 'sid' must be a string")
        agent_claim, agent = _agent(claims, mapping.agent)
        delegation = _delegation(claims)
        for text in (user, tenant, sid, agent, *values, *delegation):
            if not _valid_text(text):
                raise _unauthenticated("a claim is not valid Unicode or is too long")
        # Canonical at the boundary, exact everywhere after (docs/contract.md, "Identity
        # normalization"): nothing is rewritten, a claim not already canonical is refused.
        # The provider's role values are checked before mapping, naming their claim.
        named = [(sub_name, user), *((roles_name, r) for r in values)]
        if mapping.tenant_constant is None:
            named.append((tenant_name, tenant))
        if agent_claim:
            named.append((agent_claim, agent))
        named += [("act.sub", actor) for actor in delegation]
        for name, value in named:
            if (problem := canonical_problem(value)) is not None:
                raise _unauthenticated(f"claim {name!r} {problem}: {value!r}")
        roles = mapping.mapped_roles(values)
        # The issuer's binding (ADR 0078): a token asserting more than its issuer may is
        # refused whole, never trimmed, and the refusal names the rule.
        refused = issuer.binding.refusal(tenant, roles)
        if refused is not None:
            rule, why = refused
            reason = f"{why} (issuer {issuer.issuer!r}, rule {rule!r})"
            raise Rejection(
                Code.UNAUTHENTICATED,
                f"invalid session token: {reason}",
                {"reason": reason, "rule": rule, "issuer": issuer.issuer},
            )
        return Principal(
            user=user,
            tenant=tenant,
            roles=roles,
            session_id=sid,
            expires_at=exp_ms,
            agent=agent,
            delegation=delegation,
        )


def _agent(claims: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str, str]:
    """The claim naming the agent (the client acting for the user) and its value, or
    ``("", "")`` when the token names none: the first of ``names`` present (the issuer's
    ``ClaimsMapping.agent``). A present claim that is not a string is refused, never
    skipped for the next one."""
    for name in names:
        if name in claims:
            value = claims[name]
            if not isinstance(value, str):
                raise _unauthenticated(f"claim {name!r} must be a string")
            return name, value
    return "", ""


MAX_DELEGATION_DEPTH = 8  # ``act`` nested deeper than this is refused, never truncated


def _delegation(claims: Mapping[str, Any]) -> tuple[str, ...]:
    """The subjects of the RFC 8693 ``act`` chain, the current actor first.

    Each ``act`` must be an object whose ``sub`` is a non-empty string (its other members,
    ``iss`` and the like, are not recorded); a malformed or deeper chain than
    ``MAX_DELEGATION_DEPTH`` refuses the token whole: a chain recorded in part would
    misstate who acted."""
    chain: list[str] = []
    node: Any = claims
    while "act" in node:
        node = node["act"]
        if len(chain) == MAX_DELEGATION_DEPTH:
            raise _unauthenticated(f"claim 'act' is nested deeper than {MAX_DELEGATION_DEPTH}")
        if not isinstance(node, dict):
            raise _unauthenticated("claim 'act' must be an object")
        sub = node.get("sub")
        if not isinstance(sub, str) or not sub:
            raise _unauthenticated("claim 'act' must name a non-empty string 'sub'")
        chain.append(sub)
    return tuple(chain)


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


def _header_kid(token: str) -> str | None:
    """The ``kid`` of the token's header, unverified: only to pick the key."""
    import jwt

    try:
        header = jwt.get_unverified_header(token) if isinstance(token, str) and token else {}
    except (jwt.PyJWTError, ValueError):  # UnicodeError too: decode_signed names why
        return None
    kid = header.get("kid")
    return kid if isinstance(kid, str) else None


def _unverified_issuer(token: str) -> object:
    """The ``iss`` claim before any signature check: only to word a refusal."""
    import jwt

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


__all__ = [
    "AUDIENCE",
    "DEV_ISSUER",
    "REQUIRED_CLAIMS",
    "SessionIssuer",
    "SessionVerifier",
    "canonical_problem",
    "fold_identity",
    "looks_alike",
]
