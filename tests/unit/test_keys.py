"""Key material and the one JWS verification path (C6, C11; ADR 0003)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import stat
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from callgate.adapters.keyfiles import load_or_create_keyring
from callgate.domain.keys import (
    APPROVAL_KEY_FILE,
    SESSION_KEY_FILE,
    KeyRing,
    SignatureError,
    decode_signed,
    private_key_to_pem,
)

RING = KeyRing.generate()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _segment(obj: dict[str, Any]) -> str:
    return _b64(json.dumps(obj).encode())


def test_generate_gives_distinct_keys_and_kids_derived_from_public_keys() -> None:
    other = KeyRing.generate("prod")
    assert RING.session_kid != RING.approval_kid
    assert RING.session_kid.startswith("dev-session-")
    assert RING.approval_kid.startswith("dev-approval-")
    assert other.session_kid.startswith("prod-session-")
    assert other.session_kid != RING.session_kid
    # The same private key always gets the same kid (reloaded keys keep their kid).
    same = KeyRing.from_pem(
        private_key_to_pem(RING.session_signing_key), private_key_to_pem(RING.approval_signing_key)
    )
    assert (same.session_kid, same.approval_kid) == (RING.session_kid, RING.approval_kid)


def test_load_or_create_writes_0600_pem_files_once_and_reuses_them(tmp_path: Path) -> None:
    first = load_or_create_keyring(tmp_path)
    for name in (SESSION_KEY_FILE, APPROVAL_KEY_FILE):
        path = tmp_path / "keys" / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert not list((tmp_path / "keys").glob(".tmp-*"))
    second = load_or_create_keyring(tmp_path)
    assert second.session_kid == first.session_kid
    assert second.approval_kid == first.approval_kid
    token = jwt.encode({"x": 1}, first.session_signing_key, "EdDSA", {"kid": first.session_kid})
    assert decode_signed(token, second.session_verification_keys())[1] == {"x": 1}


def test_approval_keys_do_not_verify_sessions_and_vice_versa() -> None:
    token = jwt.encode({"x": 1}, RING.approval_signing_key, "EdDSA", {"kid": RING.approval_kid})
    with pytest.raises(SignatureError, match="unknown key id"):
        decode_signed(token, RING.session_verification_keys())
    assert decode_signed(token, RING.approval_verification_keys())[1] == {"x": 1}


def test_alg_none_is_refused() -> None:
    header = {"alg": "none", "kid": RING.session_kid, "typ": "JWT"}
    token = f"{_segment(header)}.{_segment({'sub': 'mallory'})}."
    with pytest.raises(SignatureError, match="algorithm 'none' not accepted"):
        decode_signed(token, RING.session_verification_keys())


def test_hs256_signed_with_the_public_key_is_refused() -> None:
    """The classic key-confusion attack: HMAC keyed with the (public) verification key."""
    public_pem = RING.session_signing_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    signing_input = f"{_segment({'alg': 'HS256', 'kid': RING.session_kid})}.{_segment({'a': 1})}"
    mac = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
    with pytest.raises(SignatureError, match="algorithm 'HS256' not accepted"):
        decode_signed(f"{signing_input}.{_b64(mac)}", RING.session_verification_keys())


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("", "no token"),
        ("garbage", "malformed token"),
        ("a.b.c", "malformed token"),
        (f"{_segment({'alg': 'EdDSA'})}.{_segment({})}.", "unknown key id"),
    ],
)
def test_garbage_is_refused_with_a_reason(token: str, reason: str) -> None:
    with pytest.raises(SignatureError, match=reason):
        decode_signed(token, RING.session_verification_keys())


def test_forged_signature_and_tampered_payload_are_refused() -> None:
    keys = RING.session_verification_keys()
    forged = jwt.encode({"a": 1}, Ed25519PrivateKey.generate(), "EdDSA", {"kid": RING.session_kid})
    with pytest.raises(SignatureError, match="bad signature"):
        decode_signed(forged, keys)
    good = jwt.encode({"a": 1}, RING.session_signing_key, "EdDSA", {"kid": RING.session_kid})
    head, _, sig = good.split(".")
    with pytest.raises(SignatureError, match="bad signature"):
        decode_signed(f"{head}.{_segment({'a': 2})}.{sig}", keys)


def test_typ_is_enforced_when_asked() -> None:
    token = jwt.encode({"a": 1}, RING.session_signing_key, "EdDSA", {"kid": RING.session_kid})
    keys = RING.session_verification_keys()
    with pytest.raises(SignatureError, match="wrong token type"):
        decode_signed(token, keys, typ="callgate-approval+jwt")
    assert decode_signed(token, keys, typ="JWT")[1] == {"a": 1}


def test_non_object_payload_is_refused() -> None:
    token = jwt.PyJWS().encode(
        b"[1,2]", RING.session_signing_key, "EdDSA", {"kid": RING.session_kid}
    )
    with pytest.raises(SignatureError, match="not a JSON object"):
        decode_signed(token, RING.session_verification_keys())
