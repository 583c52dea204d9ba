"""A real authorization server in the suite (issue 38.6, ADR 0082): Keycloak, started from
Maven Central's distribution on loopback (``tools/keycloak.py``), realms imported as an
adopter configures them (``tests/keycloak/realm.py``). Against it:

- the claims mapping of its realm roles through the ``keycloak`` preset, keys from its
  discovery document, a call run end to end with its token;
- the issuer binding: a second customer's realm asserting a tenant it is not bound to, or
  granting the operator role, is ``unauthenticated`` naming the rule, nothing run;
- a key rotation at Keycloak picked up with no restart, the removed key refused;
- token exchange (RFC 8693): the HTTP provider and the MCP upstream log the
  ``Authorization`` header they receive: a token Keycloak issued for their audience, whose
  subject is the user, issued to callgate, never the caller's token; an exchange Keycloak
  refuses is ``token_exchange_failed`` before the upstream is called.

``make test-keycloak``; skipped, printing why, only where Keycloak cannot start (no Java,
no Maven), and failing instead under ``CALLGATE_REQUIRE_KEYCLOAK=1`` (CI).
"""

from __future__ import annotations

import base64
import os
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from tools.keycloak import Keycloak, KeycloakUnavailable

from callgate.adapters.keyfiles import generate_private_key, private_pem
from callgate.bootstrap import Settings, bootstrap
from callgate.domain.catalog import default_profile_path
from callgate.domain.codes import Code, Rejection
from callgate.domain.keys import PrivateKey
from callgate.domain.principal import Principal
from callgate.surfaces.sdk import Gateway, connect
from tests.keycloak import realm
from tests.mcp_support import effects, heard, http_upstream, write_profile
from tests.token_server import LoggingProvider

pytestmark = pytest.mark.keycloak

REQUIRE_ENV = "CALLGATE_REQUIRE_KEYCLOAK"


@dataclass
class Realms:
    keycloak: Keycloak
    assertion_key: PrivateKey


@pytest.fixture(scope="module")
def realms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Realms]:
    """One Keycloak for the module, with the two realms imported."""
    log = tmp_path_factory.mktemp("keycloak") / "keycloak.log"
    try:
        keycloak = Keycloak(log).start()
    except (KeycloakUnavailable, OSError) as exc:
        message = f"keycloak tests skipped: Keycloak cannot start: {exc}"
        print(message, file=sys.stderr)
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {message}")
        pytest.skip(message)
    try:
        key = generate_private_key("RS256")
        der = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        keycloak.import_realm(realm.acme(base64.b64encode(der).decode()))
        keycloak.import_realm(realm.globex())
        keycloak.permit_exchange("acme", "callgate", "callgate", ["crm", "notes"])
        yield Realms(keycloak, key)
    finally:
        keycloak.stop()


def user_token(kc: Keycloak, realm_name: str, user: str, client: str = "agent-cli") -> str:
    """The session token an agent gets from Keycloak for ``user`` (password grant)."""
    answer = httpx.post(
        kc.token_endpoint(realm_name),
        data={"grant_type": "password", "client_id": client, "username": user,
              "password": realm.PASSWORD},
        timeout=30,
    )  # fmt: skip
    answer.raise_for_status()
    token: str = answer.json()["access_token"]
    return token


def issuers_toml(kc: Keycloak, **acme: str) -> str:
    extra = "".join(f"{k} = {v}\n" for k, v in acme.items())
    return (
        "[[sessions.issuers]]\n"
        f'issuer = "{kc.issuer("acme")}"\n'
        'preset = "keycloak"\n'
        "discovery = true\n"
        'algorithms = ["RS256"]\n'
        'tenant = "acme"\n' + extra + "[[sessions.issuers]]\n"
        f'issuer = "{kc.issuer("globex")}"\n'
        'preset = "keycloak"\n'
        "discovery = true\n"
        'algorithms = ["RS256"]\n'
        'tenant_claim = "tenant"\n'
        'tenants = ["globex"]\n'
    )


def settings(tmp_path: Path, toml: str, profile: Path | None = None) -> Settings:
    conf = tmp_path / "callgate.toml"
    conf.write_text(toml)
    overrides: dict[str, Any] = {"state_dir": tmp_path / "state"}
    if profile is not None:
        overrides["profile"] = profile
    return Settings.from_env(config_file=conf, environ={}, **overrides)


def test_realm_roles_map_through_the_keycloak_preset_and_a_call_runs(
    realms: Realms, tmp_path: Path
) -> None:
    kc = realms.keycloak
    gate = connect(settings(tmp_path, issuers_toml(kc)))
    try:
        token = user_token(kc, "acme", "alice")
        principal = gate.app.session_verifier.verify(token, gate.app.clock())
        read = gate.propose(token, "tickets.read", {"ticket_id": "T-1"})
    finally:
        gate.close()
    assert principal == Principal(
        realm.ALICE_ID,
        "acme",
        ("support",),
        principal.session_id,
        principal.expires_at,
        agent="agent-cli",
    )
    assert principal.session_id  # Keycloak's sid claim
    assert read["outcome"] == "executed", read


def test_a_realm_asserts_only_what_its_issuer_is_bound_to(realms: Realms, tmp_path: Path) -> None:
    kc = realms.keycloak
    gate = connect(settings(tmp_path, issuers_toml(kc)))
    try:
        verify = gate.app.session_verifier.verify
        # globex's realm says tenant acme: refused, nothing read.
        liar = user_token(kc, "globex", "gus", client="liar-cli")
        with pytest.raises(Rejection) as tenant:
            verify(liar, gate.app.clock())
        read = gate.propose(liar, "tickets.read", {"ticket_id": "T-1"})
        # globex's realm grants gus callgate-operator: refused (no operators = true).
        operator = user_token(kc, "globex", "gus")
        with pytest.raises(Rejection) as role:
            verify(operator, gate.app.clock())
    finally:
        gate.close()
    assert tenant.value.code is Code.UNAUTHENTICATED
    assert tenant.value.details["rule"] == "tenants"
    assert read["outcome"] == "unauthenticated" and not read.get("result"), read
    assert role.value.code is Code.UNAUTHENTICATED
    assert role.value.details["rule"] == "operators"


def test_a_key_rotation_at_keycloak_is_picked_up_with_no_restart(
    realms: Realms, tmp_path: Path
) -> None:
    kc = realms.keycloak
    toml = issuers_toml(kc, jwks_refresh_s="1", jwks_min_refresh_s="0")
    app = bootstrap(settings(tmp_path, toml))
    verify = app.session_verifier.verify
    before = user_token(kc, "acme", "alice")
    assert verify(before, app.clock()).user == realm.ALICE_ID
    old_kid = jwt.get_unverified_header(before)["kid"]
    with kc.admin() as admin:
        realm_id = admin.get("/acme").json()["id"]
        providers = admin.get("/acme/components", params={"type": KEY_PROVIDER}).json()
        old = [p for p in providers if p["providerId"] == "rsa-generated"]
        created = admin.post("/acme/components", json={
            "name": "rsa-rotated", "providerId": "rsa-generated", "providerType": KEY_PROVIDER,
            "parentId": realm_id,
            "config": {"priority": ["500"], "keySize": ["2048"], "algorithm": ["RS256"]},
        })  # fmt: skip
        created.raise_for_status()
        after = user_token(kc, "acme", "alice")
        new_kid = jwt.get_unverified_header(after)["kid"]
        assert new_kid != old_kid
        # The new kid is unknown to callgate: fetched on sight, no restart.
        assert verify(after, app.clock()).user == realm.ALICE_ID
        for provider in old:
            admin.delete(f"/acme/components/{provider['id']}").raise_for_status()
    time.sleep(1.2)  # past jwks_refresh_s: the next verification fetches the keys again
    with pytest.raises(Rejection) as info:
        verify(before, app.clock())
    assert info.value.code is Code.UNAUTHENTICATED
    assert old_kid in info.value.message
    assert verify(after, app.clock()).user == realm.ALICE_ID


KEY_PROVIDER = "org.keycloak.keys.KeyProvider"


def upstream_token(kc: Keycloak, folder: Path, key: PrivateKey, audience: str) -> dict[str, Any]:
    """``upstream_token:`` for Keycloak's token exchange (external to internal)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "keycloak-secret").write_text(realm.CALLGATE_SECRET)
    (folder / "assertion.pem").write_bytes(private_pem(key))
    return {
        "grant": "token_exchange",
        "token_endpoint": kc.token_endpoint("acme"),
        "client_id": "callgate",
        "client_secret": {"file": "keycloak-secret"},
        "audience": audience,
        "parameters": {"subject_issuer": "callgate"},
        "subject": {
            "issuer": realm.ASSERTION_ISSUER,
            "audience": kc.issuer("acme"),
            "key": {"file": "assertion.pem"},
            "kid": realm.ASSERTION_KID,
            "claims": {"typ": "Bearer"},  # Keycloak reads only access-token-typed JWTs
        },
    }


def crm_profile(folder: Path, base_url: str, tokens: dict[str, dict[str, Any]]) -> Path:
    """The shipped profile plus ``crm.create`` and ``ledger.create`` on HTTP providers."""
    source = default_profile_path()
    raw = yaml.safe_load(source.read_text())
    for name, token in tokens.items():
        raw["providers"][name] = {"kind": "http", "base_url": base_url, "upstream_token": token}
        raw["tools"][f"{name}.create"] = {
            "provider": name, "callers": ["support"], "impact": "low", "mutation": True,
            "require_dry_run": False, "confirmation": "none", "target_arg": None,
            "args_schema": {"type": "object", "properties": {}, "additionalProperties": False},
        }  # fmt: skip
    shutil.copy(source.parent / raw["policy_file"], folder / raw["policy_file"])
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def upstream_claims(kc: Keycloak, authorization: str | None, audience: str) -> dict[str, Any]:
    """The claims of a token the upstream received, its signature checked with Keycloak's
    published keys and its audience with the upstream's."""
    assert authorization is not None and authorization.startswith("Bearer ")
    keys = jwt.PyJWKClient(f"{kc.issuer('acme')}/protocol/openid-connect/certs")
    token = authorization[7:]
    found: dict[str, Any] = jwt.decode(
        token,
        keys.get_signing_key_from_jwt(token).key,
        algorithms=["RS256"],
        audience=audience,
        issuer=kc.issuer("acme"),
    )
    return found


def test_the_http_provider_gets_a_token_keycloak_exchanged_for_the_user(
    realms: Realms, tmp_path: Path
) -> None:
    kc, key = realms.keycloak, realms.assertion_key
    folder = tmp_path / "profile"
    provider = LoggingProvider()
    crm = upstream_token(kc, folder, key, "crm")
    broken = {**upstream_token(kc, folder, key, "no-such-client")}
    profile = crm_profile(folder, provider.url, {"crm": crm, "ledger": broken})
    gate = connect(settings(tmp_path, issuers_toml(kc), profile))
    try:
        alice = user_token(kc, "acme", "alice")
        done = gate.propose(alice, "crm.create", {}, idempotency_key="c-1")
        refused = gate.propose(alice, "ledger.create", {}, idempotency_key="l-1")
    finally:
        gate.close()
        provider.stop()
    assert done["outcome"] == "executed", done
    assert refused["outcome"] == "token_exchange_failed", refused
    [(path, authorization)] = provider.heard  # one request: the refused call sent none
    assert path == "/execute" and authorization is not None
    assert alice not in authorization  # never the caller's token
    claims = upstream_claims(kc, authorization, "crm")
    caller = jwt.decode(alice, options={"verify_signature": False})
    assert claims["sub"] == caller["sub"] == realm.ALICE_ID  # the user
    assert claims["azp"] == "callgate"  # issued to callgate, the actor
    assert claims["act"] == {"sub": "callgate"}
    assert claims["realm_access"]["roles"] == ["support"]


def test_the_mcp_upstream_gets_a_token_keycloak_exchanged_for_the_user(
    realms: Realms, tmp_path: Path
) -> None:
    kc, key = realms.keycloak, realms.assertion_key
    ledger = tmp_path / "notes.jsonl"
    folder = tmp_path / "profile"
    with http_upstream(ledger, tmp_path / "upstream.log") as url:
        profile = write_profile(folder, ledger, url=url, timeout_s=10.0, with_defaults=True)
        raw = yaml.safe_load(profile.read_text())
        notes = raw["providers"]["notes"]
        notes["upstream_token"] = upstream_token(kc, folder, key, "notes")
        # The same upstream under an audience Keycloak knows no client of: refused there.
        raw["providers"]["elsewhere"] = {
            **notes,
            "upstream_token": upstream_token(kc, folder, key, "no-such-client"),
        }
        raw["tools"]["elsewhere.quick_write"] = {
            **raw["tools"]["notes.quick_write"],
            "provider": "elsewhere",
        }
        profile.write_text(yaml.safe_dump(raw, sort_keys=False))
        gate: Gateway = connect(settings(tmp_path, issuers_toml(kc), profile))
        try:
            alice = user_token(kc, "acme", "alice")
            note = {"note_id": "N-1", "text": "hello"}
            wrote = gate.propose(alice, "notes.quick_write", note, idempotency_key="w-1")
            other = {"note_id": "N-2", "text": "x"}
            refused = gate.propose(alice, "elsewhere.quick_write", other, idempotency_key="w-2")
        finally:
            gate.close()
    assert wrote["outcome"] == "executed", wrote
    assert refused["outcome"] == "token_exchange_failed", refused
    [call] = [h for h in heard(ledger) if h["tool"] == "write_note"]  # none for N-2
    assert alice not in call["authorization"]
    claims = upstream_claims(kc, call["authorization"], "notes")
    assert (claims["sub"], claims["azp"], claims["act"]) == (
        realm.ALICE_ID,
        "callgate",
        {"sub": "callgate"},
    )
    assert [e["note_id"] for e in effects(ledger)] == ["N-1"]
