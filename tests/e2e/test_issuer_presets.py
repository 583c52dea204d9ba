"""Tokens shaped as Entra ID and Keycloak issue them, through the command line in
production mode (ADR 0078): each provider publishes its discovery document and keys over
real HTTP (``tests.jwks_server``), callgate maps its claims by preset and binds it to
its tenant. Between commands the provider rotates its keys."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.rsa import generate_private_key

from tests.e2e.test_real_issuer import propose
from tests.jwks_server import KeyServer

pytestmark = pytest.mark.e2e

ENTRA_TID = "9188040d-6c67-4c5b-b112-36a304b66dad"


def rsa() -> Any:
    return generate_private_key(public_exponent=65537, key_size=2048)


def test_entra_and_keycloak_shaped_tokens_on_the_command_line(tmp_path: Path) -> None:
    entra, keycloak = KeyServer(), KeyServer()
    try:
        entra.add("entra-1", rsa())
        keycloak.add("kc-1", rsa())
        state = tmp_path / "state"
        state.mkdir()
        (state / "callgate.toml").write_text(
            "[[sessions.issuers]]\n"
            f'issuer = "{entra.issuer}"\n'
            'preset = "entra"\ndiscovery = true\naudience = "api://callgate"\n'
            'algorithms = ["RS256"]\n'
            f'tenants = ["{ENTRA_TID}"]\n'
            "[sessions.issuers.role_map]\n"
            '"Tickets.Work" = "support"\n'
            "[[sessions.issuers]]\n"
            f'issuer = "{keycloak.issuer}"\n'
            f'preset = "keycloak"\njwks_uri = "{keycloak.jwks_uri}"\n'
            'algorithms = ["RS256"]\ntenant = "acme"\n'
        )
        now = int(time.time())
        times = {"iat": now, "exp": now + 600}
        entra_token = entra.token("entra-1", {
            **times, "aud": "api://callgate", "ver": "2.0", "tid": ENTRA_TID,
            "oid": "5d6c1a2b-0000-4000-8000-00000000a11c", "sub": "pairwise-sub",
            "azp": "desk-agent", "roles": ["Tickets.Work"],
        })  # fmt: skip
        ticket: dict[str, object] = {
            "title": "t",
            "requester_id": "5d6c1a2b-0000-4000-8000-00000000a11c",
        }
        created = propose(state, entra_token, "tickets.create", ticket)
        assert created["outcome"] == "executed", created

        kc_claims = {
            **times, "aud": ["callgate", "account"], "azp": "agent-cli", "sub": "alice",
            "realm_access": {"roles": ["offline_access", "support"]},
        }  # fmt: skip
        read = propose(
            state, keycloak.token("kc-1", kc_claims), "tickets.read", {"ticket_id": "T-1"}
        )
        assert read["outcome"] == "executed", read

        # Keycloak's realm says another tenant's role: refused; an Entra token of another
        # directory: refused.
        other = entra.token("entra-1", {**times, "aud": "api://callgate", "tid": "other-dir",
                                        "oid": "o", "roles": []})  # fmt: skip
        refused = propose(state, other, "tickets.read", {"ticket_id": "T-1"})
        assert refused["outcome"] == "unauthenticated", refused

        # Keycloak rotates its key; the next command fetches the new set: the old token
        # is refused, a token of the new key accepted.
        old = keycloak.token("kc-1", kc_claims)
        keycloak.add("kc-2", rsa())
        keycloak.remove("kc-1")
        gone = propose(state, old, "tickets.read", {"ticket_id": "T-1"})
        assert gone["outcome"] == "unauthenticated" and "unknown key id 'kc-1'" in str(
            gone["error"]
        )
        fresh = propose(
            state, keycloak.token("kc-2", kc_claims), "tickets.read", {"ticket_id": "T-1"}
        )
        assert fresh["outcome"] == "executed", fresh
    finally:
        entra.stop()
        keycloak.stop()
