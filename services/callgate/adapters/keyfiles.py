"""Key files of a deployment: PEM key pairs, JWKS documents (``callgate keys generate``) and
the state directory's development keys (``load_or_create_keyring``).

A configured key is named by its ``kid`` and may be EdDSA (Ed25519), ES256 (P-256) or
RS256 (RSA, at least 2048 bits); ``keys.algorithm_of`` says which. Private keys are PEM
(PKCS#8, unencrypted, written mode 0600); public keys are PEM (SubjectPublicKeyInfo) or a
JWKS document (RFC 7517), the form identity providers publish. Every loader raises
``KeyFileError`` naming the file and what is wrong with it, so that a broken
configuration fails at start with a message an operator can act on.

An adapter (file I/O and key generation): the domain's keys (``callgate.domain.keys``)
are values built from bytes, never read from disk there.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from callgate.adapters.atomic_file import write_atomically
from callgate.domain.keys import (
    ALGORITHMS,
    APPROVAL_KEY_FILE,
    SESSION_KEY_FILE,
    KeyRing,
    PrivateKey,
    PublicKey,
    algorithm_of,
    private_key_to_pem,
)
from callgate.domain.limits import parse_document

KINDS = ("session", "approval")


class KeyFileError(ValueError):
    """A key file that cannot be used; the message names the file."""


def generate_private_key(alg: str) -> PrivateKey:
    if alg == "EdDSA":
        return Ed25519PrivateKey.generate()
    if alg == "ES256":
        return ec.generate_private_key(ec.SECP256R1())
    if alg == "RS256":
        return rsa.generate_private_key(public_exponent=65537, key_size=3072)
    raise ValueError(f"unknown algorithm {alg!r} (one of {', '.join(ALGORITHMS)})")


def private_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_pem(key: PublicKey) -> bytes:
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _accepted(key: Any, path: Path | str) -> str:
    try:
        return algorithm_of(key)
    except ValueError as exc:
        raise KeyFileError(f"{path}: {exc}") from None


def load_private_key(path: Path) -> PrivateKey:
    """A PEM private key of one of the accepted algorithms."""
    try:
        key = serialization.load_pem_private_key(_read(path), password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise KeyFileError(f"{path}: unsupported key type {type(key).__name__}")
    _accepted(key, path)
    return key


def load_public_key(path: Path) -> PublicKey:
    """A PEM public key (or the public half of a PEM private key) of an accepted algorithm."""
    data = _read(path)
    try:
        key: Any = serialization.load_pem_public_key(data)
    except ValueError:
        try:
            key = serialization.load_pem_private_key(data, password=None).public_key()
        except (ValueError, TypeError) as exc:
            raise KeyFileError(f"{path}: not a PEM public key ({exc})") from None
    _accepted(key, path)
    return key  # type: ignore[no-any-return]


def load_jwks(path: Path) -> dict[str, PublicKey]:
    """The public keys of a JWKS file, by ``kid`` (``parse_jwks``)."""
    data = _read(path)
    try:
        doc = parse_document(data)  # the one strict reader: no duplicate keys
    except ValueError as exc:
        raise KeyFileError(f"{path}: not JSON ({exc})") from None
    return parse_jwks(doc, str(path))


def parse_jwks(doc: Any, where_from: str) -> dict[str, PublicKey]:
    """The public keys of a JWKS document (a file's or an identity provider's ``jwks_uri``),
    by ``kid``; each key needs a unique ``kid``.

    Keys whose ``use`` is not ``sig`` are skipped (an encryption key never verifies a
    signature); a key whose ``alg`` disagrees with its type is refused.
    """
    entries = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise KeyFileError(f"{where_from}: a JWKS document needs a 'keys' array")
    out: dict[str, PublicKey] = {}
    for i, entry in enumerate(entries):
        where = f"{where_from}: keys[{i}]"
        if not isinstance(entry, dict):
            raise KeyFileError(f"{where}: not an object")
        if entry.get("use", "sig") != "sig":
            continue
        kid = entry.get("kid")
        if not isinstance(kid, str) or not kid:
            raise KeyFileError(f"{where}: needs a 'kid'")
        if kid in out:
            raise KeyFileError(f"{where}: duplicate kid {kid!r}")
        if "d" in entry or "p" in entry:
            raise KeyFileError(f"{where}: holds private key material; publish public keys only")
        import jwt  # where used (start-up: callgate.domain.keys)

        try:
            key: Any = jwt.PyJWK(entry).key
        except jwt.PyJWTError as exc:
            raise KeyFileError(f"{where}: unusable key ({exc})") from None
        alg = _accepted(key, where_from)
        if entry.get("alg", alg) != alg:
            raise KeyFileError(f"{where}: 'alg' {entry['alg']!r} does not match its {alg} key")
        out[kid] = key
    return out


def jwk(kid: str, key: PublicKey) -> dict[str, Any]:
    """The public JWK of ``key`` with its ``kid``, ``alg`` and ``use: sig``."""
    from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

    alg = algorithm_of(key)
    if isinstance(key, Ed25519PublicKey):
        body = OKPAlgorithm.to_jwk(key, as_dict=True)
    elif isinstance(key, ec.EllipticCurvePublicKey):
        body = ECAlgorithm.to_jwk(key, as_dict=True)
    else:
        body = RSAAlgorithm.to_jwk(key, as_dict=True)
    return {**body, "kid": kid, "alg": alg, "use": "sig"}


def jwks(keys: Mapping[str, PublicKey]) -> dict[str, Any]:
    return {"keys": [jwk(kid, key) for kid, key in keys.items()]}


@dataclass(frozen=True)
class GeneratedKey:
    """What ``keys generate`` wrote."""

    kind: str
    kid: str
    alg: str
    private_key: Path
    public_key: Path
    jwks: Path
    jwks_kids: tuple[str, ...]


def jwks_file(out_dir: Path, kind: str) -> Path:
    return out_dir / f"{kind}-jwks.json"


def generate_key_pair(out_dir: Path, kind: str, alg: str, kid: str) -> GeneratedKey:
    """Write ``<kid>.pem`` (private, 0600), ``<kid>.pub.pem`` and add the public key to
    ``<kind>-jwks.json`` in ``out_dir`` (other kids there stay: rotation keeps the old
    key verifying). An existing key file of that kid is never overwritten."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")
    if not kid or "/" in kid or kid.startswith("."):
        raise ValueError(f"kid {kid!r} must be a non-empty file name")
    out_dir.mkdir(parents=True, exist_ok=True)
    private_path, public_path = out_dir / f"{kid}.pem", out_dir / f"{kid}.pub.pem"
    document = jwks_file(out_dir, kind)
    existing = load_jwks(document) if document.exists() else {}
    if private_path.exists() or public_path.exists() or kid in existing:
        raise FileExistsError(f"a key with kid {kid!r} already exists in {out_dir}")
    key = generate_private_key(alg)
    keys = {**existing, kid: key.public_key()}
    try:
        write_atomically(private_path, private_pem(key), 0o600)
        write_atomically(public_path, public_pem(key.public_key()), 0o644)
        write_atomically(document, (json.dumps(jwks(keys), indent=2) + "\n").encode(), 0o644)
    except BaseException:  # e.g. a full disk: all three files, or none (ADR 0084)
        private_path.unlink(missing_ok=True)
        public_path.unlink(missing_ok=True)
        raise
    return GeneratedKey(kind, kid, alg, private_path, public_path, document, tuple(keys))


def load_or_create_keyring(directory: Path, kid_prefix: str = "dev") -> KeyRing:
    """Keys under ``<directory>/keys/``: created (mode 0600) on first run, reused after.

    These are the development issuer's key and the approval key used when the
    configuration names none (one instance). Issuers to trust and shared approval
    keys come from the configuration instead (docs/configuration.md). Concurrent
    first runs agree on one key: each writes a temporary file and hard-links it
    into place, and the loser reads the winner's.
    """
    key_dir = directory / "keys"
    key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return KeyRing.from_pem(
        _load_or_create_private(key_dir / SESSION_KEY_FILE),
        _load_or_create_private(key_dir / APPROVAL_KEY_FILE),
        kid_prefix,
    )


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


REDACTION_KEY_FILE = "redaction.pem"


def redaction_key(directory: Path) -> bytes:
    """The HMAC key of sensitive-field digests (ADR 0035), from ``<directory>/keys/``.

    Kept as an Ed25519 private key file like the others (created once, race-safe); the HMAC
    key is SHA-256 over a label and its PEM. Processes that share a state directory share
    the key, so equal values give equal digests in every view.
    """
    key_dir = directory / "keys"
    key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    pem = _load_or_create_private(key_dir / REDACTION_KEY_FILE)
    return hashlib.sha256(b"callgate redaction key v1\n" + pem).digest()


REQUEST_STATE_KEY_FILE = "request-state.pem"


def request_state_key(directory: Path) -> bytes:
    """The secret that seals MCP ``requestState`` (ADR 0065), from ``<directory>/keys/``:
    kept like the redaction key, so every ``callgate mcp`` on one state directory, and one
    restarted, opens the states the others sealed."""
    key_dir = directory / "keys"
    key_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    pem = _load_or_create_private(key_dir / REQUEST_STATE_KEY_FILE)
    return hashlib.sha256(b"callgate request-state key v1\n" + pem).digest()
