"""C6: identity comes from the signed session, never from model-generated arguments."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from callgate.domain.codes import Code, Rejection
from callgate.domain.identity import SessionIssuer, SessionVerifier, TrustedIssuer
from callgate.domain.identity_args import MAX_ARGS_DEPTH, check_identity
from callgate.domain.keys import KeyRing
from callgate.domain.principal import Principal

RING = KeyRing.generate()
ISSUER = SessionIssuer(RING.session_signing_key, RING.session_kid)
VERIFIER = SessionVerifier(RING.session_verification_keys(), "callgate-dev", "callgate")
T0 = 1_700_000_000_123  # epoch ms, deliberately not on a second boundary
ALICE = Principal(user="alice", tenant="acme", roles=("support",))
ALICE_EXP = (T0 // 1000 + 60) * 1000  # expiry of the hand-made claims below


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _segment(obj: dict[str, Any]) -> str:
    return _b64(json.dumps(obj).encode())


def _claims(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "sub": "alice",
        "tenant": "acme",
        "roles": ["support"],
        "iat": T0 // 1000,
        "nbf": T0 // 1000,
        "exp": T0 // 1000 + 60,
        "iss": "callgate-dev",
        "aud": "callgate",
        "sid": "s-1",
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def _sign(claims: dict[str, Any], key: Ed25519PrivateKey | None = None) -> str:
    return jwt.encode(claims, key or RING.session_signing_key, "EdDSA", {"kid": RING.session_kid})


def _rejected(token: str, now_ms: int = T0) -> Rejection:
    with pytest.raises(Rejection) as info:
        VERIFIER.verify(token, now_ms)
    assert info.value.code is Code.UNAUTHENTICATED
    return info.value


# --- tokens -----------------------------------------------------------------------------


def test_issue_verify_round_trip() -> None:
    token = ISSUER.issue("alice", "acme", ("support", "admin"), T0, ttl_seconds=600)
    principal = VERIFIER.verify(token, T0)
    assert principal.user == "alice"
    assert principal.tenant == "acme"
    assert principal.roles == ("support", "admin")
    assert principal.session_id.startswith("s-")
    assert principal.expires_at == (T0 // 1000 + 600) * 1000
    header = jwt.get_unverified_header(token)
    assert header == {"alg": "EdDSA", "kid": RING.session_kid, "typ": "JWT"}


def test_session_id_is_deterministic_unless_given() -> None:
    a = VERIFIER.verify(ISSUER.issue("alice", "acme", ["support"], T0), T0)
    b = VERIFIER.verify(ISSUER.issue("alice", "acme", ["support"], T0), T0)
    c = VERIFIER.verify(ISSUER.issue("bob", "acme", ["support"], T0), T0)
    d = VERIFIER.verify(ISSUER.issue("alice", "acme", ["support"], T0, session_id="mine"), T0)
    assert a.session_id == b.session_id != c.session_id
    assert d.session_id == "mine"


def test_forged_signature_is_unauthenticated() -> None:
    token = _sign(_claims(), key=Ed25519PrivateKey.generate())
    assert "bad signature" in _rejected(token).message


def test_tampered_payload_is_unauthenticated() -> None:
    head, _, sig = _sign(_claims()).split(".")
    tampered = f"{head}.{_segment(_claims(sub='mallory', roles=['admin']))}.{sig}"
    assert "bad signature" in _rejected(tampered).message


def test_alg_none_token_is_unauthenticated() -> None:
    token = f"{_segment({'alg': 'none', 'kid': RING.session_kid})}.{_segment(_claims())}."
    assert "algorithm 'none' not accepted" in _rejected(token).message


def test_hs256_token_keyed_with_the_kid_is_unauthenticated() -> None:
    signing_input = f"{_segment({'alg': 'HS256', 'kid': RING.session_kid})}.{_segment(_claims())}"
    mac = hmac.new(RING.session_kid.encode(), signing_input.encode(), hashlib.sha256).digest()
    assert "algorithm 'HS256' not accepted" in _rejected(f"{signing_input}.{_b64(mac)}").message


@pytest.mark.parametrize("token", ["", "not-a-jwt", "a.b.c", "e30.e30.e30"])
def test_garbage_is_unauthenticated(token: str) -> None:
    _rejected(token)


def test_unknown_kid_is_unauthenticated() -> None:
    token = jwt.encode(_claims(), RING.session_signing_key, "EdDSA", {"kid": "someone-else"})
    assert "unknown key id" in _rejected(token).message


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"aud": "other-service"}, "wrong audience"),
        ({"aud": ["a", "b"]}, "wrong audience"),
        ({"iss": "evil-issuer"}, "wrong issuer"),
        ({"tenant": None}, "missing claims: tenant"),
        ({"sub": None, "exp": None}, "missing claims: sub, exp"),
        ({"roles": "admin"}, "'roles' must be a list of strings"),
        ({"roles": ["admin", 1]}, "'roles' must be a list of strings"),
        ({"sub": 7}, "'sub' must be a non-empty string"),
        ({"tenant": ""}, "'tenant' must be a non-empty string"),
        ({"exp": "soon"}, "'exp' must be a number"),
        ({"exp": True}, "'exp' must be a number"),
        ({"sid": 3}, "'sid' must be a string"),
    ],
)
def test_bad_claims_are_unauthenticated_with_the_reason(
    overrides: dict[str, Any], reason: str
) -> None:
    rejection = _rejected(_sign(_claims(**overrides)))
    assert reason in rejection.message
    assert reason in rejection.details["reason"]


def test_audience_list_containing_ours_is_accepted() -> None:
    assert VERIFIER.verify(_sign(_claims(aud=["x", "callgate"])), T0).user == "alice"


def test_platform_issuer_tokens_verify_without_nbf_or_sid() -> None:
    platform = Ed25519PrivateKey.generate()
    verifier = SessionVerifier.of_issuers(
        [
            TrustedIssuer(
                "https://platform.example", "callgate", {"platform-1": platform.public_key()}
            )
        ]
    )
    claims = _claims(iss="https://platform.example", nbf=None, sid=None)
    token = jwt.encode(claims, platform, "EdDSA", {"kid": "platform-1"})
    assert verifier.verify(token, T0) == Principal("alice", "acme", ("support",), "", ALICE_EXP)
    # The development issuer is not trusted by that verifier, and the refusal says why.
    with pytest.raises(Rejection) as refused:
        verifier.verify(ISSUER.issue("alice", "acme", [], T0), T0)
    assert refused.value.code is Code.UNAUTHENTICATED
    assert refused.value.message == (
        "development session token: development mode is off (use --dev or CALLGATE_DEV=1)"
    )
    # A token of an unknown key from another issuer still names the key.
    other = jwt.encode(claims, platform, "EdDSA", {"kid": "platform-2"})
    with pytest.raises(Rejection, match="unknown key id 'platform-2'"):
        verifier.verify(other, T0)


@given(
    issued_ms=st.integers(min_value=0, max_value=4_000_000_000_000),
    ttl=st.integers(min_value=1, max_value=86_400),
    offset_ms=st.integers(min_value=-5_000, max_value=86_405_000),
)
def test_token_is_valid_exactly_within_its_window(issued_ms: int, ttl: int, offset_ms: int) -> None:
    token = ISSUER.issue("alice", "acme", ["support"], issued_ms, ttl_seconds=ttl)
    start = issued_ms // 1000 * 1000
    end = start + ttl * 1000
    now = issued_ms + offset_ms
    if start <= now < end:
        assert VERIFIER.verify(token, now).user == "alice"
    else:
        reason = "expired" if now >= end else "not yet valid"
        assert reason in _rejected(token, now).message


def test_exact_window_edges() -> None:
    token = ISSUER.issue("alice", "acme", [], T0, ttl_seconds=10)
    start = T0 // 1000 * 1000
    end = start + 10_000
    assert VERIFIER.verify(token, start).user == "alice"
    assert VERIFIER.verify(token, end - 1).user == "alice"
    assert "expired" in _rejected(token, end).message
    assert "not yet valid" in _rejected(token, start - 1).message


def test_leeway_widens_both_ends() -> None:
    token = ISSUER.issue("alice", "acme", [], T0, ttl_seconds=10)
    end = (T0 // 1000 + 10) * 1000
    lenient = SessionVerifier(RING.session_verification_keys(), leeway_ms=500)
    assert lenient.verify(token, end + 499).user == "alice"
    assert lenient.verify(token, T0 // 1000 * 1000 - 500).user == "alice"
    _rejected(token, end)


def test_iat_in_the_future_is_unauthenticated() -> None:
    token = _sign(_claims(nbf=None, iat=T0 // 1000 + 30))
    assert "issued in the future" in _rejected(token).message


# --- C6: identity fields in arguments -----------------------------------------------------

IDENTITY = ("requester_id", "issued_by")
TENANT = ("tenant", "tenant_id")


def _spoof(args: dict[str, Any]) -> str:
    with pytest.raises(Rejection) as info:
        check_identity(IDENTITY, TENANT, args, ALICE)
    assert info.value.code is Code.IDENTITY_SPOOF
    return str(info.value.details["field"])


def test_matching_identity_is_accepted_and_taken_from_the_session() -> None:
    args = {"title": "t", "requester_id": "alice", "tenant_id": "acme"}
    assert check_identity(IDENTITY, TENANT, args, ALICE) == args


def test_model_supplied_user_at_top_level_is_a_spoof() -> None:
    """V1: a mutation with a model-supplied user id."""
    assert _spoof({"title": "t", "requester_id": "mallory"}) == "requester_id"


def test_other_tenant_is_a_spoof() -> None:
    assert _spoof({"order_id": "o1", "tenant": "globex"}) == "tenant"


def test_spoof_nested_in_dicts_and_lists_reports_the_dotted_path() -> None:
    assert _spoof({"fields": {"meta": {"tenant_id": "globex"}}}) == "fields.meta.tenant_id"
    args = {"items": [{"issued_by": "alice"}, {"note": [{"issued_by": "bob"}]}]}
    assert _spoof(args) == "items.1.note.0.issued_by"


def test_identity_keys_are_matched_case_and_width_insensitively() -> None:
    assert _spoof({"fields": {"TENANT_ID": "globex"}}) == "fields.TENANT_ID"
    assert _spoof({"\uff34enant": "globex"}) == "\uff34enant"  # full-width T


@pytest.mark.parametrize(
    "spelling",
    ["ALICE", "Alice ", " alice", "\uff21\uff2c\uff29\uff23\uff25 ", "\uff41lice"],
)
def test_other_spellings_of_the_session_user_are_spoofs(spelling: str) -> None:
    """Exact to grant: case, width and padding make another identifier (ADR 0023)."""
    assert _spoof({"requester_id": spelling, "title": "x"}) == "requester_id"
    assert _spoof({"requester_id": "alice", "nested": [{"tenant": " ACME"}]}) == "nested.0.tenant"


def test_the_exact_session_identity_passes_unchanged() -> None:
    args = {"requester_id": "alice", "nested": [{"tenant": "acme"}], "title": "x"}
    assert check_identity(IDENTITY, TENANT, args, ALICE) == args


@pytest.mark.parametrize("spelling", ["ALICE", "\uff41lice", "\u0430lice", "ACME", "acme\u200b"])
def test_a_free_form_look_alike_of_the_session_identity_is_a_spoof(spelling: str) -> None:
    """Folding only denies: free text that folds to the session's user or tenant without
    being it is refused, naming the field and the reason."""
    with pytest.raises(Rejection) as info:
        check_identity(IDENTITY, TENANT, {"fields": {"assignee": spelling}}, ALICE)
    assert info.value.code is Code.IDENTITY_SPOOF
    assert info.value.details == {"field": "fields.assignee", "reason": "look-alike"}


@pytest.mark.parametrize("spelling", ["\u0430lice", "alic\u0435", "\u0391LICE", "al1ce", ""])
def test_confusables_and_near_misses_are_spoofs(spelling: str) -> None:
    """Cyrillic a/e and Greek Alpha look like Latin letters but are other users."""
    assert _spoof({"requester_id": spelling}) == "requester_id"


@pytest.mark.parametrize("value", [None, 42, True, ["alice"], {"id": "alice"}])
def test_non_string_identity_values_are_spoofs(value: Any) -> None:
    assert _spoof({"issued_by": value}) == "issued_by"


def test_too_deep_arguments_are_refused() -> None:
    deep: dict[str, Any] = {"x": 1}
    for _ in range(MAX_ARGS_DEPTH + 2):
        deep = {"d": deep}
    with pytest.raises(Rejection) as info:
        check_identity(IDENTITY, TENANT, deep, ALICE)
    assert info.value.code is Code.INVALID_ARGUMENTS


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "title", "x"]), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.dictionaries(st.sampled_from(["a", "b", "title"]), _json, max_size=4))
def test_arguments_without_identity_fields_pass_unchanged(args: dict[str, Any]) -> None:
    assert check_identity(IDENTITY, TENANT, args, ALICE) == args


@given(
    st.dictionaries(st.sampled_from(["a", "b"]), _json, max_size=3),
    st.sampled_from(IDENTITY),
    st.text(min_size=1, max_size=8),
)
def test_any_other_user_value_is_rejected(args: dict[str, Any], key: str, user: str) -> None:
    args = {**args, "wrap": [{key: user}]}
    if user == "alice":
        assert check_identity(IDENTITY, TENANT, args, ALICE)["wrap"] == [{key: "alice"}]
    else:
        assert _spoof(args) == f"wrap.0.{key}"


# --- the agent (azp / client_id) --------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "agent"),
    [
        ({}, ""),
        ({"azp": "desk-agent"}, "desk-agent"),
        ({"client_id": "cli-agent"}, "cli-agent"),
        ({"azp": "desk-agent", "client_id": "cli-agent"}, "desk-agent"),
    ],
)
def test_the_agent_comes_from_azp_else_client_id(extra: dict[str, Any], agent: str) -> None:
    assert VERIFIER.verify(_sign(_claims(**extra)), T0).agent == agent


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"azp": 7}, "claim 'azp' must be a string"),
        ({"azp": 7, "client_id": "ok"}, "claim 'azp' must be a string"),
        ({"client_id": ["a"]}, "claim 'client_id' must be a string"),
        ({"azp": ""}, "claim 'azp' is empty"),
        ({"client_id": "bot "}, "claim 'client_id' has surrounding white space"),
        ({"azp": "bo\u200bt"}, "claim 'azp' contains the invisible or control code point U+200B"),
    ],
)
def test_an_agent_claim_not_canonical_is_unauthenticated(
    extra: dict[str, Any], reason: str
) -> None:
    assert reason in _rejected(_sign(_claims(**extra))).message
