"""Keys that rotate (ADR 0078): an issuer's keys from its ``jwks_uri`` over real HTTP on
loopback (``tests.jwks_server``), refreshed on a timer and for an unknown kid (rate
limited), kept through a short outage, never fetched for an issuer not configured. The
adapter's clock is injected; the provider's keys change while the verifier runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.rsa import generate_private_key as rsa_key
from tests.jwks_server import KeyServer

from callgate.adapters.jwks import RotatingKeys
from callgate.adapters.oidc import _get_json
from callgate.domain.claims import Binding
from callgate.domain.codes import Code, Rejection
from callgate.domain.identity import SessionVerifier, TrustedIssuer

NOW_S = int(time.time())
NOW_MS = NOW_S * 1000


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def idp() -> Iterator[KeyServer]:
    server = KeyServer()
    server.add("k1", generate_private_key(SECP256R1()))
    try:
        yield server
    finally:
        server.stop()


def rotating(server: KeyServer, clock: Clock, **limits: float) -> RotatingKeys:
    keys = RotatingKeys(
        server.issuer,
        lambda: _get_json(server.jwks_uri),
        ("ES256", "RS256"),
        refresh_s=limits.get("refresh_s", 600.0),
        min_refresh_s=limits.get("min_refresh_s", 30.0),
        max_stale_s=limits.get("max_stale_s", 3600.0),
        clock=clock,
    )
    keys.start()
    return keys


def verifier_of(*pairs: tuple[KeyServer, RotatingKeys]) -> SessionVerifier:
    return SessionVerifier.of_issuers(
        [
            TrustedIssuer(
                s.issuer,
                "callgate",
                {},
                ("ES256", "RS256"),
                binding=Binding(frozenset({"acme"})),
                key_set=k,
            )
            for s, k in pairs
        ]
    )


def claims(**extra: Any) -> dict[str, Any]:
    base = {"aud": "callgate", "sub": "alice", "tenant": "acme", "roles": ["support"]}
    return {"iat": NOW_S, "exp": NOW_S + 600, **base, **extra}


def refused(v: SessionVerifier, token: str) -> str:
    with pytest.raises(Rejection) as info:
        v.verify(token, NOW_MS)
    assert info.value.code is Code.UNAUTHENTICATED
    return info.value.message


def test_a_rotation_is_picked_up_without_restart_and_the_removed_key_is_refused(
    idp: KeyServer,
) -> None:
    clock = Clock()
    keys = rotating(idp, clock)
    v = verifier_of((idp, keys))
    old = idp.token("k1", claims())
    assert v.verify(old, NOW_MS).user == "alice"
    assert idp.jwks_fetches() == 1  # at start only
    # The provider rotates: k2 joins, k1 leaves. A k2 token is an unknown kid: one fetch.
    idp.add("k2", rsa_key(public_exponent=65537, key_size=2048))
    idp.remove("k1")
    clock.t += 31
    new = idp.token("k2", claims())
    assert v.verify(new, NOW_MS).user == "alice"
    assert idp.jwks_fetches() == 2
    # After that refresh, the k1 token (verified and cached before) is refused.
    assert "unknown key id 'k1'" in refused(v, old)
    assert idp.jwks_fetches() == 2  # within min_refresh_s: no fetch for it


def test_the_timer_refreshes_and_an_unknown_kid_is_rate_limited(idp: KeyServer) -> None:
    clock = Clock()
    keys = rotating(idp, clock, refresh_s=600, min_refresh_s=30)
    v = verifier_of((idp, keys))
    idp.add("k9", generate_private_key(SECP256R1()), publish=False)
    made_up = idp.token("k9", claims())
    for _ in range(5):  # a flood of made-up kids costs at most one fetch per 30 s
        assert "unknown key id 'k9'" in refused(v, made_up)
    assert idp.jwks_fetches() == 1  # start; the first refusal was within 30 s of it
    clock.t += 30
    for _ in range(5):
        refused(v, made_up)
    assert idp.jwks_fetches() == 2
    # The timer: once refresh_s has passed, the next verification fetches again.
    idp.published.append("k9")
    clock.t += 600
    assert v.verify(made_up, NOW_MS).user == "alice"
    assert idp.jwks_fetches() == 3


def test_keys_are_kept_through_a_short_outage_then_dropped(idp: KeyServer) -> None:
    clock = Clock()
    keys = rotating(idp, clock, refresh_s=60, min_refresh_s=10, max_stale_s=300)
    v = verifier_of((idp, keys))
    token = idp.token("k1", claims())
    idp.up = False
    clock.t += 200  # refreshes fail; the keys in hand still verify
    assert v.verify(token, NOW_MS).user == "alice"
    clock.t += 101  # 301 s after the last good fetch: no key is trusted any more
    assert "unknown key id 'k1'" in refused(v, token)
    idp.up = True  # the provider is back: the next due refresh restores the keys
    clock.t += 60
    assert v.verify(token, NOW_MS).user == "alice"


def test_no_fetch_for_a_token_whose_issuer_is_not_configured(idp: KeyServer) -> None:
    clock = Clock()
    keys = rotating(idp, clock, min_refresh_s=0)
    v = verifier_of((idp, keys))
    stranger = KeyServer()
    try:
        stranger.add("s1", generate_private_key(SECP256R1()))
        token = stranger.token("s1", claims())
        assert "unknown key id 's1'" in refused(v, token)
        assert idp.jwks_fetches() == 1 and stranger.requests == []
        # Its iss claim naming the configured issuer makes the configured one fetch,
        # never the URL of the token's maker.
        forged = stranger.token("s1", claims(iss=idp.issuer))
        refused(v, forged)
        assert idp.jwks_fetches() == 2 and stranger.requests == []
    finally:
        stranger.stop()


def test_the_same_kid_on_two_issuers_is_refused(idp: KeyServer) -> None:
    clock = Clock()
    other = KeyServer()
    try:
        other.add("o1", generate_private_key(SECP256R1()))
        v = verifier_of((idp, rotating(idp, clock)), (other, rotating(other, clock)))
        token = idp.token("k1", claims())
        assert v.verify(token, NOW_MS).user == "alice"
        # The other provider starts publishing a key under idp's kid k1.
        other.add("k1", generate_private_key(SECP256R1()))
        other.private["k1"] = idp.private["k1"]
        clock.t += 601  # both refresh on their timer
        assert "key id 'k1' belongs to two session issuers" in refused(v, token)
        # At start it is refused too.
        with pytest.raises(ValueError, match="belongs to two session issuers"):
            verifier_of((idp, rotating(idp, clock)), (other, rotating(other, clock)))
    finally:
        other.stop()


def test_a_key_of_an_algorithm_the_issuer_may_not_use_is_refused(idp: KeyServer) -> None:
    clock = Clock()
    keys = RotatingKeys(
        idp.issuer,
        lambda: _get_json(idp.jwks_uri),
        ("RS256",),
        refresh_s=600,
        min_refresh_s=0,
        max_stale_s=3600,
        clock=clock,
    )
    with pytest.raises(ValueError, match="'k1' is ES256, not among the allowed"):
        keys.start()
