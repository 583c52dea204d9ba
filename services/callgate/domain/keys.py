"""Key material for session tokens (C6) and approval artifacts (C11).

Two separate key pairs: one signs development session tokens, one signs approval
artifacts, so a leaked approval key cannot mint sessions and vice versa. Key ids
(``kid``) of the development keys are derived from the public key, so a key reloaded
from disk keeps its kid. Configured keys (``callgate.toml``, ``adapters/keyfiles.py``) may be
EdDSA (Ed25519), ES256 (P-256) or RS256 (RSA, 2048 bits or more); the algorithm of a
token must be the one of the key its ``kid`` names.

This module is an adapter: it generates keys (randomness) and reads/writes PEM files.
``decode_signed`` is the one place where a compact JWS is verified; the pure modules
``identity`` and ``approvals`` call it and map its reasons to their codes.
See docs/adr/0003-signed-tokens-eddsa-jwt.md and docs/adr/0013-configuration-and-dev-mode.md.

PyJWT is imported inside the functions that sign or read a token, here and in the modules
that use it: with the X.509 and HTTP modules it loads it costs a new process tens of
milliseconds, which a command that handles no token (``callgate propose`` without an
idempotency key, ``callgate --help``) should not pay.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import (
    SECP256R1,
    EllipticCurvePrivateKey,
    EllipticCurvePublicKey,
)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey, RSAPublicKey

ALGORITHM = "EdDSA"  # the development keys' algorithm, and the default everywhere
ALGORITHMS = ("EdDSA", "ES256", "RS256")  # every algorithm a configured key may use
MIN_RSA_BITS = 2048

PublicKey = Ed25519PublicKey | EllipticCurvePublicKey | RSAPublicKey
PrivateKey = Ed25519PrivateKey | EllipticCurvePrivateKey | RSAPrivateKey


def algorithm_of(key: PublicKey | PrivateKey) -> str:
    """The one JWS algorithm a key signs or verifies with; ``ValueError`` for any other key."""
    if isinstance(key, Ed25519PublicKey | Ed25519PrivateKey):
        return "EdDSA"
    if isinstance(key, EllipticCurvePublicKey | EllipticCurvePrivateKey):
        if isinstance(key.curve, SECP256R1):
            return "ES256"
        raise ValueError(f"EC curve {key.curve.name} is not accepted (only P-256 for ES256)")
    if isinstance(key, RSAPublicKey | RSAPrivateKey):
        if key.key_size < MIN_RSA_BITS:
            raise ValueError(f"RSA key of {key.key_size} bits (at least {MIN_RSA_BITS})")
        return "RS256"
    raise ValueError(f"unsupported key type {type(key).__name__}")


MAX_TOKEN_CHARS = 16_384  # longer tokens are refused before any parsing

SESSION_KEY_FILE = "session-issuer.pem"
APPROVAL_KEY_FILE = "approval-signer.pem"


class SignatureError(ValueError):
    """A token failed structural or signature verification; ``reason`` says which check."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def key_id(prefix: str, role: str, public_key: Ed25519PublicKey) -> str:
    """Stable kid: prefix, role and a fingerprint of the raw public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return f"{prefix}-{role}-{hashlib.sha256(raw).hexdigest()[:16]}"


def private_key_from_pem(data: bytes) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(data, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError("not an Ed25519 private key")
    return key


def public_key_from_pem(data: bytes) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(data)
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("not an Ed25519 public key")
    return key


def private_key_to_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass(frozen=True)
class KeyRing:
    """Signing keys of this deployment plus the public keys it trusts, by kid."""

    session_signing_key: Ed25519PrivateKey
    session_kid: str
    approval_signing_key: Ed25519PrivateKey
    approval_kid: str

    @classmethod
    def from_private_keys(
        cls,
        session_key: Ed25519PrivateKey,
        approval_key: Ed25519PrivateKey,
        kid_prefix: str = "dev",
    ) -> KeyRing:
        return cls(
            session_signing_key=session_key,
            session_kid=key_id(kid_prefix, "session", session_key.public_key()),
            approval_signing_key=approval_key,
            approval_kid=key_id(kid_prefix, "approval", approval_key.public_key()),
        )

    @classmethod
    def generate(cls, kid_prefix: str = "dev") -> KeyRing:
        """Fresh keys (for tests and throwaway runs)."""
        return cls.from_private_keys(
            Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate(), kid_prefix
        )

    @classmethod
    def from_pem(cls, session_pem: bytes, approval_pem: bytes, kid_prefix: str = "dev") -> KeyRing:
        return cls.from_private_keys(
            private_key_from_pem(session_pem), private_key_from_pem(approval_pem), kid_prefix
        )

    def session_verification_keys(self) -> dict[str, PublicKey]:
        """The development issuer's public key, by kid."""
        return {self.session_kid: self.session_signing_key.public_key()}

    def approval_verification_keys(self) -> dict[str, PublicKey]:
        return {self.approval_kid: self.approval_signing_key.public_key()}


def decode_signed(
    token: str,
    keys: Mapping[str, PublicKey],
    typ: str | None = None,
    algorithms: tuple[str, ...] = (ALGORITHM,),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify a compact JWS and return ``(header, claims)``. Reads no clock.

    Only an ``alg`` among ``algorithms`` with a known ``kid`` passes, and the ``alg`` must
    be the one of that key: "none", HS* and other algorithms are refused before any key
    is used, so an attacker cannot choose the algorithm (nor confuse key types). When
    ``typ`` is given the header must carry exactly it. Time claims are left to the
    caller, which checks them against a ``now_ms`` it was given.
    """
    import jwt  # here, not at the top (module docstring)

    if not isinstance(token, str) or not token:
        raise SignatureError("no token")
    if not token.isascii() or len(token) > MAX_TOKEN_CHARS:
        # A compact JWS is base64url and dots: anything else (a lone surrogate, which would
        # make the JWT library raise UnicodeEncodeError) is malformed, refused here.
        raise SignatureError("malformed token")
    try:
        header = jwt.get_unverified_header(token)
    except jwt.PyJWTError:
        raise SignatureError("malformed token") from None
    alg = header.get("alg")
    if alg not in algorithms:
        raise SignatureError(f"algorithm {alg!r} not accepted (only {', '.join(algorithms)})")
    if typ is not None and header.get("typ") != typ:
        raise SignatureError(f"wrong token type {header.get('typ')!r} (expected {typ!r})")
    kid = header.get("kid")
    if not isinstance(kid, str) or kid not in keys:
        # Typically a token of another deployment or state directory (its own dev keys).
        raise SignatureError(f"signed by a key this state does not trust (unknown key id {kid!r})")
    if algorithm_of(keys[kid]) != alg:
        raise SignatureError(f"algorithm {alg!r} does not match key {kid!r}")
    try:
        decoded = jwt.PyJWS().decode_complete(token, keys[kid], algorithms=[alg])
    except jwt.InvalidSignatureError:
        raise SignatureError(
            "bad signature: not signed by the key this state trusts under that key id"
        ) from None
    except jwt.PyJWTError:
        raise SignatureError("malformed token") from None
    try:
        claims = json.loads(decoded["payload"])
    except (ValueError, UnicodeDecodeError):
        raise SignatureError("payload is not JSON") from None
    if not isinstance(claims, dict):
        raise SignatureError("payload is not a JSON object")
    return header, claims
