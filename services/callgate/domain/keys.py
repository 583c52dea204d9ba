"""Ed25519 key material for session tokens (C6) and approval artifacts (C11).

Two separate key pairs: one signs development session tokens, one signs approval
artifacts, so a leaked approval key cannot mint sessions and vice versa. Key ids
(``kid``) are derived from the public key, so a key reloaded from disk keeps its kid.

This module is an adapter: it generates keys (randomness) and reads/writes PEM files.
``decode_signed`` is the one place where a compact EdDSA JWS is verified; the pure
modules ``identity`` and ``approvals`` call it and map its reasons to their codes.
See docs/adr/0003-signed-tokens-eddsa-jwt.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALGORITHM = "EdDSA"  # the only signature algorithm callgate accepts
MAX_TOKEN_CHARS = 16_384  # longer tokens are refused before any parsing

SESSION_KEY_FILE = "session-issuer.pem"
APPROVAL_KEY_FILE = "approval-signer.pem"
TRUSTED_SESSION_DIR = "trusted-session-issuers"  # <kid>.pem public keys of platform issuers


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


def _frozen(keys: Mapping[str, Ed25519PublicKey]) -> Mapping[str, Ed25519PublicKey]:
    return MappingProxyType(dict(keys))


@dataclass(frozen=True)
class KeyRing:
    """Signing keys of this deployment plus the public keys it trusts, by kid."""

    session_signing_key: Ed25519PrivateKey
    session_kid: str
    approval_signing_key: Ed25519PrivateKey
    approval_kid: str
    # Public keys of external session issuers (the platform's issuer in production).
    trusted_session_keys: Mapping[str, Ed25519PublicKey] = field(
        default_factory=lambda: _frozen({})
    )

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

    @classmethod
    def load_or_create(cls, directory: Path, kid_prefix: str = "dev") -> KeyRing:
        """Keys under ``<directory>/keys/``: created (mode 0600) on first run, reused after.

        Public keys in ``<directory>/keys/trusted-session-issuers/<kid>.pem`` are trusted
        as extra session issuers. Concurrent first runs agree on one key: each writes a
        temporary file and hard-links it into place, and the loser reads the winner's.
        """
        key_dir = directory / "keys"
        key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        ring = cls.from_pem(
            _load_or_create_private(key_dir / SESSION_KEY_FILE),
            _load_or_create_private(key_dir / APPROVAL_KEY_FILE),
            kid_prefix,
        )
        trusted_dir = key_dir / TRUSTED_SESSION_DIR
        if trusted_dir.is_dir():
            trusted = {
                p.stem: public_key_from_pem(p.read_bytes()) for p in trusted_dir.glob("*.pem")
            }
            ring = ring.trust_session_keys(trusted)
        return ring

    def trust_session_keys(self, keys: Mapping[str, Ed25519PublicKey]) -> KeyRing:
        """A copy that also accepts session tokens signed by ``keys`` (kid -> public key)."""
        clash = set(keys) & {self.session_kid, self.approval_kid}
        if clash:
            raise ValueError(f"trusted session kid clashes with an own key: {sorted(clash)}")
        return replace(self, trusted_session_keys=_frozen({**self.trusted_session_keys, **keys}))

    def session_verification_keys(
        self, include_dev_issuer: bool = True
    ) -> dict[str, Ed25519PublicKey]:
        """Keys a session verifier trusts; production may exclude the development issuer."""
        keys = dict(self.trusted_session_keys)
        if include_dev_issuer:
            keys[self.session_kid] = self.session_signing_key.public_key()
        return keys

    def approval_verification_keys(self) -> dict[str, Ed25519PublicKey]:
        return {self.approval_kid: self.approval_signing_key.public_key()}


def _load_or_create_private(path: Path) -> bytes:
    if path.exists():
        return path.read_bytes()
    pem = private_key_to_pem(Ed25519PrivateKey.generate())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic; fails if another process won the race
        except FileExistsError:
            return path.read_bytes()
    finally:
        os.unlink(tmp)
    return pem


def decode_signed(
    token: str, keys: Mapping[str, Ed25519PublicKey], typ: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Verify a compact EdDSA JWS and return ``(header, claims)``. Reads no clock.

    Only ``alg: EdDSA`` with a known ``kid`` passes: "none", HS* and other algorithms
    are refused before any key is used, so an attacker cannot choose the algorithm.
    When ``typ`` is given the header must carry exactly it. Time claims are left to
    the caller, which checks them against a ``now_ms`` it was given.
    """
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
    if alg != ALGORITHM:
        raise SignatureError(f"algorithm {alg!r} not accepted (only {ALGORITHM})")
    if typ is not None and header.get("typ") != typ:
        raise SignatureError(f"wrong token type {header.get('typ')!r} (expected {typ!r})")
    kid = header.get("kid")
    if not isinstance(kid, str) or kid not in keys:
        # Typically a token of another deployment or state directory (its own dev keys).
        raise SignatureError(f"signed by a key this state does not trust (unknown key id {kid!r})")
    try:
        decoded = jwt.PyJWS().decode_complete(token, keys[kid], algorithms=[ALGORITHM])
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
