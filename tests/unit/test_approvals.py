"""Approval artifacts (C4, C5, C11): signed, short-lived, bound to one exact call."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from callgate.domain.approvals import (
    APPROVAL_TYP,
    BINDING_FIELDS,
    DEFAULT_MATCH_FIELDS,
    ApprovalBinding,
    ApprovalClaims,
    ApprovalSigner,
    ApprovalVerifier,
    approval_jti,
    check_approver,
    compare_binding,
    peek_partition_key,
    require_match,
)
from callgate.domain.codes import Code, Rejection
from callgate.domain.keys import KeyRing
from callgate.domain.principal import Principal

RING = KeyRing.generate()
SIGNER = ApprovalSigner(RING.approval_signing_key, RING.approval_kid)
VERIFIER = ApprovalVerifier(RING.approval_verification_keys())
T0 = 1_700_000_000_000
BINDING = ApprovalBinding(
    tenant="acme",
    actor="alice",
    tool="refunds.issue",
    target="order-1",
    policy_version="pv-3",
    args_hash="sha256:args",
    dry_run_hash="sha256:dry",
    partition_key="acme|key-1",
    invocation_id="inv-1",
)
CLAIMS = ApprovalClaims(
    jti="apr-1",
    binding=BINDING,
    approver="fiona",
    confirmation="approver",
    issued_at=T0,
    expires_at=T0 + 900_000,
)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _segment(obj: dict[str, Any]) -> str:
    return _b64(json.dumps(obj).encode())


def _payload(claims: ApprovalClaims = CLAIMS) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(SIGNER.sign(claims).split(".")[1] + "==")
    )
    return payload


def _missing(approval_id: str, now_ms: int = T0) -> Rejection:
    with pytest.raises(Rejection) as info:
        VERIFIER.verify(approval_id, now_ms)
    assert info.value.code is Code.APPROVAL_MISSING
    return info.value


# --- signing and verification (C11) ------------------------------------------------------


def test_sign_verify_round_trip() -> None:
    approval_id = SIGNER.sign(CLAIMS)
    assert VERIFIER.verify(approval_id, T0) == CLAIMS
    assert jwt.get_unverified_header(approval_id) == {
        "alg": "EdDSA",
        "kid": RING.approval_kid,
        "typ": APPROVAL_TYP,
    }


def test_artifact_carries_the_dry_run_hash_it_confirms() -> None:
    """C5: the approval hashes the dry-run snapshot the human saw."""
    assert _payload()["dry_run_hash"] == "sha256:dry"


@given(offset=st.integers(min_value=-10_000_000, max_value=10_000_000))
def test_expiry_boundary_fails_closed(offset: int) -> None:
    """C11: valid strictly before ``expires_at``; at or after it, ``approval_expired``."""
    approval_id = SIGNER.sign(CLAIMS)
    now = CLAIMS.expires_at + offset
    if now < CLAIMS.expires_at:
        assert VERIFIER.verify(approval_id, now) == CLAIMS
    else:
        with pytest.raises(Rejection) as info:
            VERIFIER.verify(approval_id, now)
        assert info.value.code is Code.APPROVAL_EXPIRED
        assert info.value.details["jti"] == "apr-1"


def test_forged_signature_is_missing_even_when_expired() -> None:
    forged = ApprovalSigner(Ed25519PrivateKey.generate(), RING.approval_kid).sign(CLAIMS)
    assert "bad signature" in _missing(forged).message
    assert "bad signature" in _missing(forged, now_ms=CLAIMS.expires_at + 1).message


def test_tampered_payload_is_missing() -> None:
    head, _, sig = SIGNER.sign(CLAIMS).split(".")
    payload = {**_payload(), "args_hash": "sha256:other", "expires_at": T0 + 10**12}
    assert "bad signature" in _missing(f"{head}.{_segment(payload)}.{sig}").message


def test_alg_none_artifact_is_missing() -> None:
    header = {"alg": "none", "kid": RING.approval_kid, "typ": APPROVAL_TYP}
    assert "algorithm 'none'" in _missing(f"{_segment(header)}.{_segment(_payload())}.").message


def test_hs256_artifact_is_missing() -> None:
    header = {"alg": "HS256", "kid": RING.approval_kid, "typ": APPROVAL_TYP}
    signing_input = f"{_segment(header)}.{_segment(_payload())}"
    mac = hmac.new(b"secret", signing_input.encode(), hashlib.sha256).digest()
    assert "algorithm 'HS256'" in _missing(f"{signing_input}.{_b64(mac)}").message


def test_session_token_is_not_an_approval() -> None:
    """Right key, wrong ``typ``: a plain JWT signed by the approval key is refused."""
    token = jwt.encode(_payload(), RING.approval_signing_key, "EdDSA", {"kid": RING.approval_kid})
    assert "wrong token type" in _missing(token).message


def test_unknown_kid_is_missing() -> None:
    other = ApprovalSigner(RING.approval_signing_key, "retired-kid").sign(CLAIMS)
    assert "unknown key id" in _missing(other).message


@pytest.mark.parametrize("approval_id", ["", "nonsense", "a.b.c", "e30.e30.e30"])
def test_garbage_is_missing(approval_id: str) -> None:
    _missing(approval_id)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"args_hash": None}, "missing claims: args_hash"),
        ({"jti": None, "expires_at": None}, "missing claims: jti, expires_at"),
        ({"actor": 5}, "'actor' must be a string"),
        ({"expires_at": "later"}, "'expires_at' must be an integer"),
        ({"expires_at": True}, "'expires_at' must be an integer"),
        ({"confirmation": "none"}, "unknown confirmation"),
    ],
)
def test_incomplete_artifacts_are_missing(change: dict[str, Any], reason: str) -> None:
    payload = {k: v for k, v in {**_payload(), **change}.items() if v is not None}
    approval_id = jwt.encode(
        payload,
        RING.approval_signing_key,
        "EdDSA",
        {"kid": RING.approval_kid, "typ": APPROVAL_TYP},
    )
    assert reason in _missing(approval_id).details["reason"]


def test_signer_refuses_nonsense_claims() -> None:
    with pytest.raises(ValueError):
        SIGNER.sign(dataclasses.replace(CLAIMS, confirmation="none"))
    with pytest.raises(ValueError):
        SIGNER.sign(dataclasses.replace(CLAIMS, expires_at=CLAIMS.issued_at))


def test_peek_partition_key_reads_routing_only() -> None:
    assert peek_partition_key(SIGNER.sign(CLAIMS)) == "acme|key-1"
    forged = ApprovalSigner(Ed25519PrivateKey.generate(), "x").sign(CLAIMS)
    assert peek_partition_key(forged) == "acme|key-1"  # unverified by design: routing only
    assert peek_partition_key("garbage") is None
    assert peek_partition_key(f"{_segment({'alg': 'EdDSA'})}.{_segment({'x': 1})}.") is None
    assert peek_partition_key(f"{_segment({'alg': 'EdDSA'})}.{_b64(b'[1]')}.") is None
    bad_type = f"{_segment({'alg': 'EdDSA'})}.{_segment({'partition_key': 3})}."
    assert peek_partition_key(bad_type) is None


# --- binding (C4, C11, V2) ----------------------------------------------------------------


def test_identical_binding_matches() -> None:
    assert compare_binding(BINDING, dataclasses.replace(BINDING)) == []
    require_match(BINDING, dataclasses.replace(BINDING))


@given(
    field=st.sampled_from(BINDING_FIELDS),
    value=st.text(max_size=12),
)
def test_any_single_changed_field_is_reported_by_name(field: str, value: str) -> None:
    presented = dataclasses.replace(BINDING, **{field: value})
    changed = value != getattr(BINDING, field)
    assert compare_binding(BINDING, presented, BINDING_FIELDS) == ([field] if changed else [])
    default_expected = [field] if changed and field in DEFAULT_MATCH_FIELDS else []
    assert compare_binding(BINDING, presented) == default_expected


def test_mismatch_names_every_differing_binding() -> None:
    """V2: change the arguments (and the actor) after confirmation."""
    presented = dataclasses.replace(BINDING, actor="mallory", args_hash="sha256:swapped")
    with pytest.raises(Rejection) as info:
        require_match(BINDING, presented)
    assert info.value.code is Code.APPROVAL_MISMATCH
    assert info.value.message == "approval does not match: actor, args_hash"
    assert info.value.details == {"bindings": "actor,args_hash"}


def test_dry_run_hash_is_compared_when_asked() -> None:
    presented = dataclasses.replace(BINDING, dry_run_hash="sha256:other")
    require_match(BINDING, presented)  # not in the default fields
    with pytest.raises(Rejection, match="dry_run_hash"):
        require_match(BINDING, presented, (*DEFAULT_MATCH_FIELDS, "dry_run_hash"))


def test_unknown_binding_field_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown binding fields"):
        compare_binding(BINDING, BINDING, ("actor", "colour"))


# --- who may confirm ------------------------------------------------------------------------

FIONA = Principal("fiona", "acme", ("finance-approver",))


@pytest.mark.parametrize(
    ("confirmation", "approver", "allow_self", "allowed"),
    [
        ("approver", FIONA, False, True),
        ("approver", Principal("fiona", "globex", ("finance-approver",)), False, False),
        ("approver", Principal("bob", "acme", ("support",)), False, False),
        ("approver", Principal("alice", "acme", ("finance-approver",)), False, False),
        ("approver", Principal("alice", "acme", ("finance-approver",)), True, True),
        ("owner", Principal("alice", "acme", ("support",)), False, True),
        ("owner", FIONA, False, False),
        ("owner", Principal("alice", "globex", ("support",)), False, False),
        ("none", Principal("alice", "acme", ("support",)), False, False),
    ],
)
def test_approver_rules(
    confirmation: str, approver: Principal, allow_self: bool, allowed: bool
) -> None:
    def check() -> None:
        check_approver(confirmation, approver, "alice", "acme", ("finance-approver",), allow_self)

    if allowed:
        check()
    else:
        with pytest.raises(Rejection) as info:
            check()
        assert info.value.code is Code.APPROVER_FORBIDDEN


def test_self_approval_is_refused_by_default_with_a_clear_message() -> None:
    alice = Principal("alice", "acme", ("finance-approver",))
    with pytest.raises(Rejection, match="own call"):
        check_approver("approver", alice, "alice", "acme", ("finance-approver",), False)


# --- jti ----------------------------------------------------------------------------------


def test_jti_is_deterministic_and_unambiguous() -> None:
    a = approval_jti("inv-1", "fiona", "ev-1")
    assert a == approval_jti("inv-1", "fiona", "ev-1")
    assert a.startswith("apr-")
    assert a != approval_jti("inv-1", "fiona", "ev-2")
    assert approval_jti("a|b", "c", "d") != approval_jti("a", "b|c", "d")
