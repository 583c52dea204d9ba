"""Identity as real identity providers issue it (C6, ADR 0078): claims mapping per issuer
and its presets (Entra ID, Okta, Auth0, Keycloak), and the binding of each issuer to the
tenants and roles it may assert. Configured through ``callgate.toml`` as an adopter would;
tokens signed with real keys."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import jwt
import pytest

from callgate.adapters.keyfiles import generate_key_pair, load_private_key
from callgate.bootstrap import Settings, bootstrap
from callgate.config import ConfigError
from callgate.domain.codes import Code, Rejection
from callgate.domain.identity import SessionVerifier
from callgate.domain.principal import Principal
from callgate.domain.scope import OPERATOR_ROLE

NOW_S = int(time.time())
NOW_MS = NOW_S * 1000


# The key files of each (provider, algorithm), generated once per run: an RS256 key is
# 3072 bits and takes up to seconds to generate, and what a test checks needs only that
# each provider of the test has its own key (distinct names, distinct keys), not a key no
# other test saw.
_GENERATED: dict[tuple[str, str], dict[str, bytes]] = {}


def keys(root: Path, name: str, alg: str = "RS256") -> Path:
    """A provider's key pair ``<name>-1`` in ``root/name`` (with its JWKS file)."""
    folder = root / name
    if not (folder / f"{name}-1.pem").exists():
        files = _GENERATED.get((name, alg))
        if files is None:
            generate_key_pair(folder, "session", alg, f"{name}-1")
            _GENERATED[(name, alg)] = {p.name: p.read_bytes() for p in folder.iterdir()}
        else:
            folder.mkdir(parents=True, exist_ok=True)
            for file_name, content in files.items():
                (folder / file_name).write_bytes(content)
                if file_name.endswith(".pem") and not file_name.endswith(".pub.pem"):
                    (folder / file_name).chmod(0o600)  # as generated: private
    return folder / "session-jwks.json"


def sign(jwks: Path, claims: dict[str, Any], kid: str | None = None, alg: str = "RS256") -> str:
    kid = kid or jwks.parent.name + "-1"
    key = load_private_key(jwks.parent / f"{kid}.pem")
    base = {"iat": NOW_S, "exp": NOW_S + 600}
    return jwt.encode({**base, **claims}, key, algorithm=alg, headers={"kid": kid})


def verifier(tmp_path: Path, toml: str) -> SessionVerifier:
    conf = tmp_path / "callgate.toml"
    conf.write_text(toml)
    settings = Settings.from_env(config_file=conf, environ={}, state_dir=tmp_path / "s")
    return bootstrap(settings).session_verifier


def refused(v: SessionVerifier, token: str) -> Rejection:
    with pytest.raises(Rejection) as info:
        v.verify(token, NOW_MS)
    assert info.value.code is Code.UNAUTHENTICATED
    return info.value


# --- presets: tokens shaped as each provider issues them ---------------------------------

ENTRA_TID = "9188040d-6c67-4c5b-b112-36a304b66dad"
PRESET_CASES: list[tuple[str, str, dict[str, Any], Principal]] = [
    (
        "entra",
        f'preset = "entra"\naudience = "api://callgate"\ntenants = ["{ENTRA_TID}"]\n'
        '[sessions.issuers.role_map]\n"Refunds.Approve" = "finance-approver"\n'
        '"Tickets.Work" = ["support"]\n',
        {  # an Entra ID v2.0 access token
            "aud": "api://callgate",
            "iss": "ISS",
            "ver": "2.0",
            "tid": ENTRA_TID,
            "oid": "00000000-0000-0000-66f3-3332eca7ea81",
            "sub": "AAAAAAAAAAAAAAAAAAAAAIkzqFVrSaSaFHy782bbtaQ",
            "azp": "6e74172b-be56-4843-9ff4-e66a39bb12e3",
            "roles": ["Refunds.Approve", "Tickets.Work", "Unrelated.Role"],
            "scp": "access_as_user",
        },
        Principal(
            "00000000-0000-0000-66f3-3332eca7ea81",
            ENTRA_TID,
            ("finance-approver", "support"),
            agent="6e74172b-be56-4843-9ff4-e66a39bb12e3",
        ),
    ),
    (
        "okta",
        'preset = "okta"\naudience = "api://callgate"\ntenant = "acme"\n'
        '[sessions.issuers.role_map]\n"callgate-support" = "support"\n',
        {  # an Okta custom authorization server's access token with a groups claim
            "ver": 1,
            "jti": "AT.0mP4JKAZX1iACIT4vbEDF7LpvDVjxypPMf0D7uX39RE",
            "iss": "ISS",
            "aud": "api://callgate",
            "cid": "0oa1hsg4ljBZ3wHzS5d7",  # the client: no azp, no client_id
            "uid": "00u1ht1n0vZVGYvTN5d7",
            "scp": ["openid", "profile"],
            "sub": "alice@acme.example",
            "groups": ["Everyone", "callgate-support"],
        },
        Principal("alice@acme.example", "acme", ("support",), agent="0oa1hsg4ljBZ3wHzS5d7"),
    ),
    (
        "auth0",
        'preset = "auth0"\naudience = "https://callgate.example/api"\ntenants = ["org_W3Tn"]\n'
        'roles = ["support", "finance-approver"]\n'
        '[sessions.issuers.role_map]\n"refunds:approve" = "finance-approver"\n',
        {  # an Auth0 access token for an organization member, RBAC permissions on
            "iss": "ISS",
            "sub": "auth0|64f1c2",
            "aud": ["https://callgate.example/api", "https://acme.eu.auth0.com/userinfo"],
            "azp": "kT8fqUpT1Ut9Z8K6RWpGvFpWQ8hCNoEz",
            "scope": "openid profile",
            "org_id": "org_W3Tn",
            "permissions": ["refunds:approve", "read:tickets"],
        },
        Principal(
            "auth0|64f1c2",
            "org_W3Tn",
            ("finance-approver",),
            agent="kT8fqUpT1Ut9Z8K6RWpGvFpWQ8hCNoEz",
        ),
    ),
    (
        "keycloak",
        'preset = "keycloak"\ntenant = "acme"\nroles = ["support"]\n'
        '[sessions.issuers.role_map]\n"callgate-support" = "support"\n',
        {  # a Keycloak access token of realm acme
            "iss": "ISS",
            "aud": ["callgate", "account"],
            "typ": "Bearer",
            "azp": "agent-cli",
            "sub": "f1b3c6de-44a0-4f0b-9b2c-0f3c1f0b9a11",
            "preferred_username": "alice",
            "realm_access": {"roles": ["offline_access", "uma_authorization", "callgate-support"]},
            "resource_access": {"account": {"roles": ["manage-account"]}},
        },
        Principal("f1b3c6de-44a0-4f0b-9b2c-0f3c1f0b9a11", "acme", ("support",), agent="agent-cli"),
    ),
]


@pytest.mark.parametrize(("preset", "table", "claims", "expected"), PRESET_CASES)
def test_tokens_shaped_as_each_provider_issues_them_are_accepted_through_the_preset(
    tmp_path: Path, preset: str, table: str, claims: dict[str, Any], expected: Principal
) -> None:
    jwks = keys(tmp_path, preset)
    issuer = f"https://{preset}.idp.example/"
    head = f'[[sessions.issuers]]\nissuer = "{issuer}"\njwks_file = "{jwks}"\n'
    v = verifier(tmp_path, head + 'algorithms = ["RS256"]\n' + table)
    principal = v.verify(sign(jwks, {**claims, "iss": issuer}), NOW_MS)
    assert principal == Principal(
        expected.user,
        expected.tenant,
        expected.roles,
        expires_at=(NOW_S + 600) * 1000,
        agent=expected.agent,
    )


@pytest.mark.parametrize(("preset", "table", "claims", "expected"), PRESET_CASES)
def test_an_idempotency_key_is_routed_by_the_mapped_tenant(
    tmp_path: Path, preset: str, table: str, claims: dict[str, Any], expected: Principal
) -> None:
    """A token whose tenant is not in a claim named ``tenant`` (a constant, ``tid``,
    ``org_id``): the SDK routes a keyed call by the verified tenant, so it is decided and
    run, not refused as misrouted."""
    jwks = keys(tmp_path, preset)
    issuer = f"https://{preset}.idp.example/"
    conf = tmp_path / "callgate.toml"
    head = f'[[sessions.issuers]]\nissuer = "{issuer}"\njwks_file = "{jwks}"\n'
    conf.write_text(head + 'algorithms = ["RS256"]\n' + table)
    settings = Settings.from_env(config_file=conf, environ={}, state_dir=tmp_path / "s")
    gate = bootstrap(settings).gateway()
    try:
        token = sign(jwks, {**claims, "iss": issuer, "exp": int(time.time()) + 600})
        first = gate.propose(token, "tickets.read", {"ticket_id": "T-1"}, idempotency_key="k-1")
        again = gate.propose(token, "tickets.read", {"ticket_id": "T-1"}, idempotency_key="k-1")
    finally:
        gate.close()
    # Decided on the tenant's key partition, never malformed_event ("misrouted"):
    # T-1 is acme's, so acme's user reads it and the key replays; another tenant is denied.
    if expected.tenant == "acme":
        assert (first["outcome"], again["outcome"]) == ("executed", "replayed"), (first, again)
    else:
        assert (first["outcome"], again["outcome"]) == ("tool_forbidden",) * 2, (first, again)


def issuer_table(jwks: Path, issuer: str, extra: str) -> str:
    return (
        f'[[sessions.issuers]]\nissuer = "{issuer}"\njwks_file = "{jwks}"\n'
        f'algorithms = ["RS256"]\n{extra}'
    )


def test_explicit_keys_override_the_preset_and_paths_are_lists(tmp_path: Path) -> None:
    jwks = keys(tmp_path, "kc")
    v = verifier(
        tmp_path,
        issuer_table(
            jwks,
            "https://kc.example/realms/acme",
            'preset = "keycloak"\ntenant = "acme"\n'
            'roles_claim = ["resource_access", "callgate", "roles"]\n'
            'subject_claim = "preferred_username"\n',
        ),
    )
    claims = {
        "iss": "https://kc.example/realms/acme",
        "aud": "callgate",
        "sub": "f1b3",
        "preferred_username": "alice",
        "realm_access": {"roles": ["admin"]},
        "resource_access": {"callgate": {"roles": ["support", "finance-approver"]}},
    }
    p = v.verify(sign(jwks, claims), NOW_MS)
    assert (p.user, p.tenant, p.roles) == ("alice", "acme", ("support", "finance-approver"))


def test_a_claim_name_with_dots_is_one_name_and_a_path_is_a_list(tmp_path: Path) -> None:
    """Auth0's namespaced claims: a string is one claim name, never split on dots."""
    jwks = keys(tmp_path, "a0")
    v = verifier(
        tmp_path,
        issuer_table(
            jwks,
            "https://a0.example/",
            'tenant_claim = "https://callgate.example/tenant"\n'
            'roles_claim = "https://callgate.example/roles"\n',
        ),
    )
    claims = {
        "iss": "https://a0.example/",
        "aud": "callgate",
        "sub": "auth0|1",
        "https://callgate.example/tenant": "acme",
        "https://callgate.example/roles": ["support"],
    }
    assert v.verify(sign(jwks, claims), NOW_MS).tenant == "acme"
    # The same values nested under the dotted parts are not that claim.
    nested: dict[str, Any] = {k: v for k, v in claims.items() if not k.startswith("https://")}
    nested["https://callgate"] = {"example/tenant": "acme"}
    assert (
        "missing claims: https://callgate.example/tenant" in refused(v, sign(jwks, nested)).message
    )
    # And a path never reads a claim whose name has the dots.
    v2 = verifier(
        tmp_path,
        issuer_table(
            jwks,
            "https://a0.example/",
            'tenant = "acme"\nroles_claim = ["realm_access", "roles"]\n',
        ),
    )
    flat = {
        "iss": "https://a0.example/",
        "aud": "callgate",
        "sub": "u",
        "realm_access.roles": ["x"],
    }
    assert v2.verify(sign(jwks, flat), NOW_MS).roles == ()  # absent: no roles, not "x"


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"tid": "acme "}, "claim 'tid' has surrounding white space"),
        ({"tid": 7}, "claim 'tid' must be a non-empty string"),
        ({"tid": None}, "missing claims: tid"),
        ({"roles": ["Tickets.Work", "Re\u200bfunds"]}, "claim 'roles' contains the invisible"),
        ({"roles": "Tickets.Work"}, "claim 'roles' must be a list of strings"),
        ({"oid": None}, "missing claims: oid"),
    ],
)
def test_a_mapped_value_is_checked_like_a_claim_naming_its_claim(
    tmp_path: Path, claims: dict[str, Any], reason: str
) -> None:
    jwks = keys(tmp_path, "entra")
    v = verifier(tmp_path, issuer_table(jwks, "https://e.example/", 'preset = "entra"\n'))
    base = {"iss": "https://e.example/", "aud": "callgate", "oid": "o-1", "tid": "acme"}
    token = sign(jwks, {k: v for k, v in {**base, **claims}.items() if v is not None})
    assert reason in refused(v, token).message


# --- binding: acme's and globex's providers -----------------------------------------------


def two_issuers(
    tmp_path: Path, acme_extra: str = "", globex_extra: str = ""
) -> tuple[SessionVerifier, Path, Path]:
    acme, globex = keys(tmp_path, "acme"), keys(tmp_path, "globex")
    toml = issuer_table(
        acme, "https://login.acme.example", f'tenants = ["acme"]\noperators = true\n{acme_extra}'
    ) + issuer_table(
        globex,
        "https://login.globex.example",
        f'tenants = ["globex"]\nroles = ["support", "finance-approver"]\n{globex_extra}',
    )
    return verifier(tmp_path, toml), acme, globex


def claims_of(issuer: str, tenant: str, *roles: str) -> dict[str, Any]:
    return {
        "iss": issuer,
        "aud": "callgate",
        "sub": "mallory",
        "tenant": tenant,
        "roles": list(roles),
    }


GLOBEX = "https://login.globex.example"


@pytest.mark.parametrize(
    ("tenant", "roles", "rule", "why"),
    [
        ("acme", ("support",), "tenants", "may not assert tenant 'acme'"),
        ("ACME", ("support",), "tenants", "may not assert tenant 'ACME'"),
        ("Globex", ("support",), "tenants", "may not assert tenant 'Globex'"),
        ("globex", (OPERATOR_ROLE,), "operators", f"may not grant {OPERATOR_ROLE!r}"),
        ("globex", ("support", "admin"), "roles", "may not grant role 'admin'"),
        ("globex", ("Support",), "roles", "may not grant role 'Support'"),
    ],
)
def test_a_token_asserting_more_than_its_issuer_may_is_unauthenticated_naming_the_rule(
    tmp_path: Path, tenant: str, roles: tuple[str, ...], rule: str, why: str
) -> None:
    v, _, globex = two_issuers(tmp_path)
    r = refused(v, sign(globex, claims_of(GLOBEX, tenant, *roles)))
    assert r.details["rule"] == rule and r.details["issuer"] == GLOBEX
    assert why in r.details["reason"] and f"rule {rule!r}" in r.message


def test_each_issuer_asserts_what_it_is_bound_to(tmp_path: Path) -> None:
    v, acme, globex = two_issuers(tmp_path)
    ok = v.verify(sign(globex, claims_of(GLOBEX, "globex", "support")), NOW_MS)
    assert (ok.tenant, ok.roles) == ("globex", ("support",))
    op = v.verify(
        sign(acme, claims_of("https://login.acme.example", "acme", OPERATOR_ROLE)), NOW_MS
    )
    assert op.roles == (OPERATOR_ROLE,)


def test_a_role_map_that_grants_a_role_outside_the_binding_is_refused_at_start(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigError, match="role_map grants 'admin', not among its roles"):
        two_issuers(tmp_path, globex_extra='[sessions.issuers.role_map]\nAdmins = "admin"\n')
    with pytest.raises(ConfigError, match=f"'{OPERATOR_ROLE}' needs operators = true"):
        two_issuers(
            tmp_path, globex_extra=f'[sessions.issuers.role_map]\nOps = "{OPERATOR_ROLE}"\n'
        )


def test_with_two_issuers_one_without_a_tenant_binding_is_a_configuration_error(
    tmp_path: Path,
) -> None:
    acme, globex = keys(tmp_path, "acme"), keys(tmp_path, "globex")
    conf = tmp_path / "callgate.toml"
    with pytest.raises(ConfigError) as err:
        verifier(
            tmp_path,
            issuer_table(acme, "https://a.example", 'tenants = ["acme"]\n')
            + issuer_table(globex, "https://g.example", ""),
        )
    assert f"configuration {conf}: key 'sessions.issuers[1].tenants': missing" in str(err.value)
    # One issuer alone may go unbound (but grants the operator role only when marked).
    v = verifier(tmp_path, issuer_table(acme, "https://a.example", ""))
    assert v.verify(sign(acme, claims_of("https://a.example", "any", "x")), NOW_MS).tenant == "any"
    r = refused(v, sign(acme, claims_of("https://a.example", "any", OPERATOR_ROLE)))
    assert r.details["rule"] == "operators"


def test_the_same_kid_on_two_issuers_is_refused_at_start(tmp_path: Path) -> None:
    acme = keys(tmp_path, "acme")
    with pytest.raises(
        ConfigError, match=r"kid 'acme-1' also belongs to issuer 'https://a\.example'"
    ):
        verifier(
            tmp_path,
            issuer_table(acme, "https://a.example", 'tenants = ["acme"]\n')
            + issuer_table(acme, "https://g.example", 'tenants = ["globex"]\n'),
        )


def test_another_audience_and_another_algorithm_than_the_keys_are_refused(tmp_path: Path) -> None:
    v, _, globex = two_issuers(tmp_path)
    other = {**claims_of(GLOBEX, "globex", "support"), "aud": "another-api"}
    assert "wrong audience" in refused(v, sign(globex, other)).message
    # The kid names an RSA key; a token saying HS256 keyed with the public key, or
    # ES256 signed with another key, is refused before any claim is read.
    claims = claims_of(GLOBEX, "globex", "support")
    forged = jwt.encode(claims, "a shared secret, 32 bytes or more", "HS256", {"kid": "globex-1"})
    assert refused(v, forged).details["reason"]
    es = keys(tmp_path, "es", "ES256")
    es_key = load_private_key(es.parent / "es-1.pem")
    wrong = jwt.encode(claims_of(GLOBEX, "globex", "support"), es_key, "ES256", {"kid": "globex-1"})
    assert refused(v, wrong).details["reason"]
