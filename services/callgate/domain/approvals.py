"""Approval artifacts (C4, C5, C11): short-lived, signed, bound to one exact call.

An ``approval_id`` is a compact EdDSA JWS over ``ApprovalClaims``. It binds tenant,
actor, tool, target, policy version, the hash of the normalized arguments and the
hash of the dry-run snapshot the human confirmed (C5), so that swapping an argument
cannot reuse it (C11). Pure given keys and ``now_ms``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from callgate.domain.codes import Code, Rejection
from callgate.domain.keys import (
    ALGORITHMS,
    PrivateKey,
    PublicKey,
    SignatureError,
    algorithm_of,
    decode_signed,
)
from callgate.domain.principal import Principal, looks_alike

APPROVAL_TYP = "callgate-approval+jwt"
CONFIRMATIONS = ("owner", "approver")
# Bindings a resubmitted call is compared on by default (C4, C11).
DEFAULT_MATCH_FIELDS = ("tenant", "actor", "tool", "target", "policy_version", "args_hash")


@dataclass(frozen=True, slots=True)
class ApprovalBinding:
    """What an approval is for. ``invocation_id`` is the invocation it was requested for."""

    tenant: str
    actor: str
    tool: str
    target: str
    policy_version: str
    args_hash: str
    dry_run_hash: str
    partition_key: str
    invocation_id: str


BINDING_FIELDS = tuple(f.name for f in dataclasses.fields(ApprovalBinding))


@dataclass(frozen=True, slots=True)
class ApprovalClaims:
    jti: str
    binding: ApprovalBinding
    approver: str
    confirmation: str  # "owner" | "approver"
    issued_at: int  # epoch milliseconds
    expires_at: int  # epoch milliseconds


class ApprovalSigner:
    """Signs with the one active approval key (``approvals.signing_kid``, rotation: ADR 0013)."""

    def __init__(self, key: PrivateKey, kid: str) -> None:
        self._key = key
        self._kid = kid
        self._alg = algorithm_of(key)

    @property
    def kid(self) -> str:
        return self._kid

    def sign(self, claims: ApprovalClaims) -> str:
        """The ``approval_id``: self-contained, signed and short-lived (C11)."""
        if claims.confirmation not in CONFIRMATIONS:
            raise ValueError(f"unknown confirmation {claims.confirmation!r}")
        if claims.expires_at <= claims.issued_at:
            raise ValueError("expires_at must be after issued_at")
        payload: dict[str, Any] = {
            "jti": claims.jti,
            "approver": claims.approver,
            "confirmation": claims.confirmation,
            "issued_at": claims.issued_at,
            "expires_at": claims.expires_at,
            **dataclasses.asdict(claims.binding),
        }
        import jwt  # where used: start-up (module docstring of callgate.domain.keys)

        return jwt.encode(
            payload, self._key, algorithm=self._alg, headers={"kid": self._kid, "typ": APPROVAL_TYP}
        )


class ApprovalVerifier:
    """Verifies with every configured approval key by kid: the active one and those kept
    for rotation, so that artifacts signed by any instance sharing the configuration
    verify everywhere (C11)."""

    def __init__(self, keys: Mapping[str, PublicKey]) -> None:
        self._keys = dict(keys)

    @property
    def kids(self) -> tuple[str, ...]:
        return tuple(self._keys)

    def verify(self, approval_id: str, now_ms: int) -> ApprovalClaims:
        """Claims of a genuine, unexpired artifact (C11).

        Anything not provably ours is ``approval_missing``; a genuine artifact at or
        past ``expires_at`` is ``approval_expired`` (fails closed).
        """
        try:
            _, raw = decode_signed(approval_id, self._keys, typ=APPROVAL_TYP, algorithms=ALGORITHMS)
        except SignatureError as e:
            raise _missing(e.reason) from None
        claims = _parse_claims(raw)
        if now_ms >= claims.expires_at:
            raise Rejection(
                Code.APPROVAL_EXPIRED,
                f"approval {claims.jti} expired at {_iso(claims.expires_at)}",
                {"jti": claims.jti, "expires_at": str(claims.expires_at)},
            )
        return claims


def _missing(reason: str) -> Rejection:
    return Rejection(
        Code.APPROVAL_MISSING, f"no valid approval presented: {reason}", {"reason": reason}
    )


def _parse_claims(raw: Mapping[str, Any]) -> ApprovalClaims:
    text_fields = ("jti", "approver", "confirmation", *BINDING_FIELDS)
    missing = [f for f in (*text_fields, "issued_at", "expires_at") if f not in raw]
    if missing:
        raise _missing(f"missing claims: {', '.join(missing)}")
    for name in text_fields:
        if not isinstance(raw[name], str):
            raise _missing(f"claim {name!r} must be a string")
    for name in ("issued_at", "expires_at"):
        if isinstance(raw[name], bool) or not isinstance(raw[name], int):
            raise _missing(f"claim {name!r} must be an integer")
    if raw["confirmation"] not in CONFIRMATIONS:
        raise _missing(f"unknown confirmation {raw['confirmation']!r}")
    return ApprovalClaims(
        jti=raw["jti"],
        binding=ApprovalBinding(**{f: raw[f] for f in BINDING_FIELDS}),
        approver=raw["approver"],
        confirmation=raw["confirmation"],
        issued_at=raw["issued_at"],
        expires_at=raw["expires_at"],
    )


def peek_claim(approval_id: str, name: str) -> str | None:
    """An unverified string claim, for routing and records only (never for a decision)."""
    import jwt

    try:
        decoded = jwt.PyJWS().decode_complete(approval_id, options={"verify_signature": False})
        value = json.loads(decoded["payload"]).get(name)
    except (jwt.PyJWTError, ValueError, UnicodeDecodeError, AttributeError, TypeError):
        return None
    return value if isinstance(value, str) else None


def peek_partition_key(approval_id: str) -> str | None:
    """The unverified ``partition_key`` claim, for routing only (never for a decision)."""
    return peek_claim(approval_id, "partition_key")


def compare_binding(
    expected: ApprovalBinding,
    presented: ApprovalBinding,
    fields: tuple[str, ...] = DEFAULT_MATCH_FIELDS,
) -> list[str]:
    """Names of the bindings in ``fields`` that differ, in ``fields`` order."""
    unknown = set(fields) - set(BINDING_FIELDS)
    if unknown:
        raise ValueError(f"unknown binding fields: {sorted(unknown)}")
    return [f for f in fields if getattr(expected, f) != getattr(presented, f)]


def require_match(
    expected: ApprovalBinding,
    presented: ApprovalBinding,
    fields: tuple[str, ...] = DEFAULT_MATCH_FIELDS,
) -> None:
    """C11: an approval only covers the exact call it was granted for (V2)."""
    differing = compare_binding(expected, presented, fields)
    if differing:
        raise Rejection(
            Code.APPROVAL_MISMATCH,
            f"approval does not match: {', '.join(differing)}",
            {"bindings": ",".join(differing)},
        )


def check_approver(
    confirmation: str,
    approver: Principal,
    actor: str,
    tenant: str,
    approver_roles: tuple[str, ...],
    allow_self_approval: bool,
) -> None:
    """Who may confirm (docs/contract.md "Confirmation"): raise ``APPROVER_FORBIDDEN`` otherwise.

    ``owner``: the human owning the session confirms, so the approver is the actor.
    ``approver``: someone holding one of ``approver_roles``; by default not the actor
    themself (C4 high impact always uses this kind). Always the same tenant.
    """
    # Exact to grant, folded only to deny (docs/contract.md, "Identity normalization").
    if approver.tenant != tenant:
        raise _forbidden("approver belongs to another tenant")
    if confirmation == "owner":
        if approver.user != actor:
            raise _forbidden("only the session owner may confirm this call")
    elif confirmation == "approver":
        if not approver.has_any_role(approver_roles):
            raise _forbidden(f"approver needs one of the roles: {', '.join(approver_roles)}")
        if approver.user == actor:
            if not allow_self_approval:
                raise _forbidden("the actor may not approve their own call")
        elif looks_alike(approver.user, actor):
            # Another identifier that reads as the actor's: separation of duties holds
            # against the look-alike even where self-approval is allowed.
            raise _forbidden("the approver's identity is a look-alike of the actor's")
    else:
        raise _forbidden(f"call does not take confirmation {confirmation!r}")


def _forbidden(message: str) -> Rejection:
    return Rejection(Code.APPROVER_FORBIDDEN, message)


def approval_jti(invocation_id: str, approver: str, decision_event_id: str) -> str:
    """Deterministic artifact id: reprocessing the same decision yields the same jti."""
    canonical = json.dumps([invocation_id, approver, decision_event_id], ensure_ascii=False)
    return "apr-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _iso(epoch_ms: int) -> str:
    """A time in a message, for people: ISO-8601 UTC (the details keep the number)."""
    stamp = datetime.fromtimestamp(epoch_ms / 1000, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")
