"""Tokens shaped as Entra ID, Okta, Auth0 and Keycloak issue them, for the end-to-end
tests of the presets (ADR 0078).

``Providers`` runs one provider per shape, each publishing its discovery document and
keys over real HTTP on loopback (``tests.jwks_server``) under the issuer path it uses
(Okta's ``/oauth2/default``, Auth0's trailing ``/``, Keycloak's ``/realms/<realm>``,
Entra's ``/<tenant id>/v2.0``); ``config`` is the ``callgate.toml`` that trusts all four
through their presets, each bound to its own tenant, as an operator with four customers
would write it. Each ``Shape`` says what callgate must record for a call made with its
token: the mapped user, tenant, roles and agent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.rsa import generate_private_key

from callgate.adapters.embedded.store import EmbeddedStore
from tests.jwks_server import KeyServer

ENTRA_TID = "9188040d-6c67-4c5b-b112-36a304b66dad"


@dataclass(frozen=True)
class Shape:
    """One provider's access token and what callgate makes of it."""

    preset: str
    path: str  # the issuer's path on the provider
    jwks_path: str  # where under it the keys are published
    table: str  # ``[[sessions.issuers]]`` keys beyond issuer, keys and algorithms
    claims: Mapping[str, Any]  # the token's claims beyond iss, iat and exp
    user: str
    tenant: str
    roles: tuple[str, ...]
    agent: str

    @property
    def kid(self) -> str:
        return f"{self.preset}-1"

    def principal(self) -> dict[str, Any]:
        """The audit record's ``authorized_by.principal`` of a call made with the token."""
        return {
            "user": self.user,
            "tenant": self.tenant,
            "roles": list(self.roles),
            "agent": self.agent,
            "delegation": [],
        }

    def ticket(self) -> dict[str, Any]:
        """``tickets.create`` for the token's user (an identity argument: checked exactly)."""
        return {"title": f"opened through {self.preset}", "requester_id": self.user}


ENTRA = Shape(
    "entra",
    f"/{ENTRA_TID}/v2.0",
    "/discovery/v2.0/keys",
    f'preset = "entra"\ndiscovery = true\naudience = "api://callgate"\ntenants = ["{ENTRA_TID}"]\n'
    'roles = ["support", "finance-approver"]\n'
    '[sessions.issuers.role_map]\n"Tickets.Work" = "support"\n'
    '"Refunds.Approve" = "finance-approver"\n',
    {  # a v2.0 access token for an app's API, app roles assigned to the user
        "aud": "api://callgate",
        "ver": "2.0",
        "tid": ENTRA_TID,
        "oid": "5d6c1a2b-0000-4000-8000-00000000a11c",
        "sub": "AAAAAAAAAAAAAAAAAAAAAIkzqFVrSaSaFHy782bbtaQ",  # pairwise: differs per app
        "azp": "6e74172b-be56-4843-9ff4-e66a39bb12e3",
        "azpacr": "1",
        "roles": ["Tickets.Work", "Directory.Reader"],
        "scp": "access_as_user",
        "name": "Alice Adams",
        "preferred_username": "alice@contoso.example",
    },
    "5d6c1a2b-0000-4000-8000-00000000a11c",
    ENTRA_TID,
    ("support",),
    "6e74172b-be56-4843-9ff4-e66a39bb12e3",
)
OKTA = Shape(
    "okta",
    "/oauth2/default",
    "/v1/keys",
    'preset = "okta"\ndiscovery = true\naudience = "api://callgate"\ntenant = "acme"\n'
    '[sessions.issuers.role_map]\n"callgate-support" = "support"\n'
    '"callgate-finance" = "finance-approver"\n',
    {  # a custom authorization server's access token with a groups claim
        "ver": 1,
        "jti": "AT.0mP4JKAZX1iACIT4vbEDF7LpvDVjxypPMf0D7uX39RE",
        "aud": "api://callgate",
        "cid": "0oa1hsg4ljBZ3wHzS5d7",
        "uid": "00u1ht1n0vZVGYvTN5d7",
        "scp": ["openid", "tickets"],
        "sub": "bob@acme.example",
        "groups": ["Everyone", "callgate-support"],
    },
    "bob@acme.example",
    "acme",
    ("support",),
    "0oa1hsg4ljBZ3wHzS5d7",
)
AUTH0 = Shape(
    "auth0",
    "/",
    "/.well-known/jwks.json",
    'preset = "auth0"\ndiscovery = true\naudience = "https://callgate.example/api"\n'
    'tenant_claim = "https://example.com/tenant"\ntenants = ["initech"]\n'
    'roles = ["support"]\n'
    '[sessions.issuers.role_map]\n"tickets:work" = "support"\n',
    {  # RBAC permissions on, the tenant from a post-login Action's namespaced claim
        "aud": ["https://callgate.example/api", "https://initech.eu.auth0.com/userinfo"],
        "sub": "auth0|64f1c2a9e4b0d3f1a2b3c4d5",
        "azp": "kT8fqUpT1Ut9Z8K6RWpGvFpWQ8hCNoEz",
        "scope": "openid profile tickets",
        "https://example.com/tenant": "initech",
        "https://example.com/roles": ["Support Agent"],
        "permissions": ["tickets:work", "reports:read"],
    },
    "auth0|64f1c2a9e4b0d3f1a2b3c4d5",
    "initech",
    ("support",),
    "kT8fqUpT1Ut9Z8K6RWpGvFpWQ8hCNoEz",
)
KEYCLOAK = Shape(
    "keycloak",
    "/realms/globex",
    "/protocol/openid-connect/certs",
    'preset = "keycloak"\ndiscovery = true\ntenant = "globex"\n'
    '[sessions.issuers.role_map]\n"callgate-support" = "support"\n',
    {  # an access token of realm globex, with an audience mapper for callgate
        "aud": ["callgate", "account"],
        "typ": "Bearer",
        "azp": "agent-cli",
        "sub": "f1b3c6de-44a0-4f0b-9b2c-0f3c1f0b9a11",
        "preferred_username": "carol",
        "scope": "openid profile",
        "realm_access": {"roles": ["offline_access", "uma_authorization", "callgate-support"]},
        "resource_access": {
            "callgate": {"roles": ["ticket-reader"]},
            "account": {"roles": ["manage-account", "view-profile"]},
        },
    },
    "f1b3c6de-44a0-4f0b-9b2c-0f3c1f0b9a11",
    "globex",
    ("support",),
    "agent-cli",
)
SHAPES = (ENTRA, OKTA, AUTH0, KEYCLOAK)
PRESET_IDS = [s.preset for s in SHAPES]


class Providers:
    """The four providers, each signing with its RSA key ``<preset>-1``."""

    def __init__(self) -> None:
        self.servers: dict[str, KeyServer] = {}
        try:
            for shape in SHAPES:
                server = self.servers[shape.preset] = KeyServer(shape.path, shape.jwks_path)
                server.add(shape.kid, generate_private_key(public_exponent=65537, key_size=2048))
        except BaseException:
            self.stop()
            raise

    def issuer(self, shape: Shape) -> str:
        return self.servers[shape.preset].issuer

    def config(self) -> str:
        """``callgate.toml``: the four issuers, each trusted through its preset."""
        return "".join(
            f'[[sessions.issuers]]\nissuer = "{self.issuer(s)}"\nalgorithms = ["RS256"]\n{s.table}'
            for s in SHAPES
        )

    def token(self, shape: Shape, ttl_s: int = 600) -> str:
        now = int(time.time())
        claims = {"iat": now, "nbf": now, "exp": now + ttl_s, **shape.claims}
        return self.servers[shape.preset].token(shape.kid, claims)

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


def production_state(directory: Path, providers: Providers) -> Path:
    """A state directory whose ``callgate.toml`` trusts the four providers (and nothing
    else: no development mode)."""
    directory.mkdir(parents=True)
    (directory / "callgate.toml").write_text(providers.config())
    return directory


def audit_records(state_dir: Path, invocation_id: str) -> list[dict[str, Any]]:
    """The audit records of one invocation in the embedded store, in chain order."""
    store = EmbeddedStore(state_dir)
    try:
        values = [json.loads(v) for _, v in store.view_items("audit")]
    finally:
        store.close()
    return [r for r in values if r["invocation_id"] == invocation_id]


def recorded_principal(state_dir: Path, invocation_id: str, timeout_s: float = 30) -> Any:
    """The principal the last audit record of a settled, executed call names (waits for
    a running server's projection)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = audit_records(state_dir, invocation_id)
        if records and records[-1]["outcome"] == "executed":
            return records[-1]["authorized_by"]["principal"]
        assert time.monotonic() < deadline, f"no executed audit record: {records}"
        time.sleep(0.1)


def event_types(state_dir: Path, invocation_id: str | None = None) -> list[str]:
    """The event types the embedded log holds (of one invocation), in log order."""
    store = EmbeddedStore(state_dir)
    try:
        rows = store.read_log() if invocation_id is None else store.read_invocation(invocation_id)
    finally:
        store.close()
    return [row.event_type or "" for row in rows]
