"""The Keycloak realms of the ``keycloak`` tier, as an adopter would configure them.

``acme``: user alice (realm role ``support``); clients ``agent-cli`` (public, password
grant: the agent that gets the user's session token, with ``callgate`` in its audience),
``callgate`` (confidential: callgate at the AS, the actor of token exchanges), and the
upstreams ``crm`` and ``notes`` (the audiences). An OpenID Connect identity provider
``callgate`` trusts callgate's assertions (signature checked with callgate's public key);
alice is linked to it under her own Keycloak id, so an assertion for her is exchanged for
a token whose subject is her. Keycloak 26.0 does not issue ``act`` (RFC 8693 4.1); the
upstream clients carry a hardcoded ``act`` naming callgate, and ``azp`` (the client the
token was issued to) is Keycloak's own statement that callgate obtained it.

``globex``: a second customer's Keycloak realm whose agent client says ``tenant: acme``
(a provider asserting a tenant it is not bound to) and whose user gus holds the realm role
``callgate-operator`` (a tenant's issuer granting the operator role).
"""

from __future__ import annotations

from typing import Any

ALICE_ID = "0b7c6f2e-1111-4c3a-9d1e-6a1f0e2b3c4d"  # her Keycloak id: callgate's user
ASSERTION_ISSUER = "https://callgate.acme.example"
ASSERTION_KID = "callgate-assertion-1"
CALLGATE_SECRET = "callgate-secret-at-keycloak"
PASSWORD = "password-for-tests"


def _mapper(name: str, kind: str, config: dict[str, str]) -> dict[str, Any]:
    return {
        "name": name,
        "protocol": "openid-connect",
        "protocolMapper": kind,
        "config": {"access.token.claim": "true", "id.token.claim": "false", **config},
    }


def _claim(name: str, value: str, json_type: str = "String") -> dict[str, Any]:
    return _mapper(
        name,
        "oidc-hardcoded-claim-mapper",
        {
            "claim.name": name,
            "claim.value": value,
            "jsonType.label": json_type,
            "userinfo.token.claim": "false",
        },
    )


AUDIENCE_CALLGATE = _mapper(
    "aud-callgate", "oidc-audience-mapper", {"included.custom.audience": "callgate"}
)
ACT_CALLGATE = _claim("act", '{"sub": "callgate"}', "JSON")


def _user(username: str, roles: list[str], **more: Any) -> dict[str, Any]:
    return {
        "username": username,
        "enabled": True,
        "email": f"{username}@example.test",
        "emailVerified": True,
        "firstName": username.title(),
        "lastName": "Test",
        "credentials": [{"type": "password", "value": PASSWORD, "temporary": False}],
        "realmRoles": roles,
        **more,
    }


def _agent(client_id: str, *mappers: dict[str, Any]) -> dict[str, Any]:
    return {
        "clientId": client_id,
        "publicClient": True,
        "directAccessGrantsEnabled": True,
        "standardFlowEnabled": False,
        "protocolMappers": [AUDIENCE_CALLGATE, *mappers],
    }


def acme(assertion_public_key: str) -> dict[str, Any]:
    """``assertion_public_key``: callgate's assertion key, base64 DER (a PEM's body)."""
    upstream = {
        "publicClient": False,
        "standardFlowEnabled": False,
        "protocolMappers": [ACT_CALLGATE],
    }
    return {
        "realm": "acme",
        "enabled": True,
        "accessTokenLifespan": 300,
        "roles": {"realm": [{"name": "support"}, {"name": "finance-approver"}]},
        "clients": [
            _agent("agent-cli"),
            {
                "clientId": "callgate",
                "publicClient": False,
                "secret": CALLGATE_SECRET,
                "serviceAccountsEnabled": True,
                "standardFlowEnabled": False,
            },
            {"clientId": "crm", "secret": "crm-secret", **upstream},
            {"clientId": "notes", "secret": "notes-secret", **upstream},
        ],
        "users": [
            _user(
                "alice",
                ["support"],
                id=ALICE_ID,
                federatedIdentities=[
                    {"identityProvider": "callgate", "userId": ALICE_ID, "userName": "alice"}
                ],
            ),
        ],
        "identityProviders": [
            {
                "alias": "callgate",
                "providerId": "oidc",
                "enabled": True,
                "config": {
                    "issuer": ASSERTION_ISSUER,
                    "validateSignature": "true",
                    "useJwksUrl": "false",
                    "publicKeySignatureVerifier": assertion_public_key,
                    "publicKeySignatureVerifierKeyId": ASSERTION_KID,
                    "syncMode": "IMPORT",
                    "disableUserInfo": "true",
                    # Unused (callgate never signs users in through Keycloak), required.
                    "clientId": "keycloak",
                    "clientSecret": "unused",
                    "clientAuthMethod": "client_secret_post",
                    "authorizationUrl": "http://127.0.0.1:9/authorize",
                    "tokenUrl": "http://127.0.0.1:9/token",
                },
            }
        ],
    }


def globex() -> dict[str, Any]:
    return {
        "realm": "globex",
        "enabled": True,
        "roles": {"realm": [{"name": "support"}, {"name": "callgate-operator"}]},
        "clients": [
            _agent("liar-cli", _claim("tenant", "acme")),
            _agent("agent-cli", _claim("tenant", "globex")),
        ],
        "users": [_user("gus", ["support", "callgate-operator"])],
    }
