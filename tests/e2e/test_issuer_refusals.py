"""What an issuer may not do is refused with nothing run (ADR 0078), through the SDK in
production mode on the embedded backend: acme's and globex's identity providers publish
their keys over real HTTP (``tests.jwks_server``, fetched by ``jwks_uri`` and refreshed
while the gateway runs). Each case presents one token to ``tickets.create`` (a mutation
that would otherwise run) and must be ``unauthenticated`` with its reason, with no policy
decision, no request to the executor, no execution and no effect.

The cases: an issuer asserting a tenant it is not bound to; a tenant's issuer granting
``callgate-operator``; a role outside the issuer's allowed set; a key id still unknown
after the refresh it caused (the provider rotated its key out); an ``alg`` other than the
key's (HMAC keyed with the public key, and another RSA algorithm signed by the right
key); a token for another audience; the same key id published by two issuers.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.rsa import generate_private_key
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from callgate.application.client import Gateway
from callgate.bootstrap import Settings
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.sdk import connect
from tests.jwks_server import KeyServer

pytestmark = pytest.mark.e2e

# Nothing of a refused call may follow its rejection: these mean it was decided or run.
RAN = {"PolicyDecided", "DryRunRequested", "ExecutionRequested", "ExecutionStarted"}
REFRESH_S = 1.0  # the providers' key sets refresh on this timer (the least allowed)


def rsa() -> Any:
    return generate_private_key(public_exponent=65537, key_size=2048)


@dataclass
class Deployment:
    """acme's provider (acme and ops, the operators) and globex's (globex; support and
    finance-approver only), and a gateway trusting both."""

    acme: KeyServer
    globex: KeyServer
    gate: Gateway

    def claims(self, user: str, tenant: str, *roles: str, **extra: Any) -> dict[str, Any]:
        now = int(time.time())
        return {"aud": "callgate", "sub": user, "tenant": tenant, "roles": list(roles),
                "iat": now, "exp": now + 600, **extra}  # fmt: skip

    def create(self, token: str, user: str) -> dict[str, Any]:
        return self.gate.propose(token, "tickets.create", {"title": "t", "requester_id": user})


@pytest.fixture
def issuer_deployment(tmp_path: Path) -> Iterator[Deployment]:
    acme, globex = KeyServer(), KeyServer()
    acme.add("acme-1", rsa())
    globex.add("globex-1", rsa())
    gate: Gateway | None = None
    try:
        tables = [
            (acme, 'tenants = ["acme", "ops"]\noperators = true\n'),
            (globex, 'tenants = ["globex"]\nroles = ["support", "finance-approver"]\n'),
        ]
        conf = tmp_path / "callgate.toml"
        conf.write_text(
            "".join(
                "[[sessions.issuers]]\n"
                f'issuer = "{server.issuer}"\njwks_uri = "{server.jwks_uri}"\n'
                f'algorithms = ["RS256"]\njwks_refresh_s = {REFRESH_S}\n'
                f"jwks_min_refresh_s = 0\n{binding}"
                for server, binding in tables
            )
        )
        settings = Settings.from_env(config_file=conf, environ={}, state_dir=tmp_path / "s")
        assert not settings.dev
        gate = connect(settings)
        yield Deployment(acme, globex, gate)
    finally:
        if gate is not None:
            gate.close()
        acme.stop()
        globex.stop()


def hs256_with_the_public_key(d: Deployment) -> str:
    """The classic confusion: HMAC keyed with the RSA public key the provider publishes."""
    public = d.globex.private["globex-1"].public_key()
    secret = public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)

    def part(value: dict[str, Any]) -> bytes:
        raw = json.dumps(value, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(raw).rstrip(b"=")

    signing_input = (
        part({"alg": "HS256", "typ": "JWT", "kid": "globex-1"})
        + b"."
        + part({"iss": d.globex.issuer, **d.claims("mallory", "globex", "support")})
    )
    mac = hmac.new(secret, signing_input, hashlib.sha256).digest()
    return (signing_input + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")).decode()


def unknown_kid_after_refresh(d: Deployment) -> str:
    """acme's token is accepted; acme rotates (acme-2 in, acme-1 out); the same token's
    kid is then unknown, and asking acme again (the refresh it causes) does not bring it
    back."""
    token = d.acme.token("acme-1", d.claims("alice", "acme", "support"))
    assert d.create(token, "alice")["outcome"] == "executed"
    d.acme.add("acme-2", rsa())
    d.acme.remove("acme-1")
    time.sleep(REFRESH_S + 0.1)  # the cached verification counts only while its key does
    return token


def same_kid_on_two_issuers(d: Deployment) -> str:
    """globex starts publishing a key under acme's kid; once both key sets are refreshed,
    the kid names neither issuer."""
    token = d.acme.token("acme-1", d.claims("alice", "acme", "support"))
    assert d.create(token, "alice")["outcome"] == "executed"
    d.globex.add("acme-1", rsa())
    time.sleep(REFRESH_S + 0.1)  # both refresh on their timer at the next verification
    return token


# (the token, its user, the reason refused, the provider whose keys are fetched while
# the call is refused: the refusal comes after the refresh, not from keys in hand)
Case = tuple[Callable[[Deployment], str], str, str, str | None]
CASES: dict[str, Case] = {
    "tenant not bound": (
        lambda d: d.globex.token("globex-1", d.claims("mallory", "acme", "support")),
        "mallory",
        "may not assert tenant 'acme' (issuer '{globex}', rule 'tenants')",
        None,
    ),
    "operator from a tenant's issuer": (
        lambda d: d.globex.token("globex-1", d.claims("mallory", "globex", OPERATOR_ROLE)),
        "mallory",
        f"may not grant {OPERATOR_ROLE!r} (issuer '{{globex}}', rule 'operators')",
        None,
    ),
    "role outside the allowed set": (
        lambda d: d.globex.token("globex-1", d.claims("mallory", "globex", "support", "admin")),
        "mallory",
        "may not grant role 'admin' (issuer '{globex}', rule 'roles')",
        None,
    ),
    "unknown kid after the refresh": (
        unknown_kid_after_refresh,
        "alice",
        "unknown key id 'acme-1'",
        "acme",
    ),
    "HS256 keyed with the public key": (
        hs256_with_the_public_key,
        "mallory",
        "algorithm 'HS256' not accepted (only RS256)",
        None,
    ),
    "RS512 signed by the key of RS256": (
        lambda d: d.globex.token("globex-1", d.claims("mallory", "globex", "support"), alg="RS512"),
        "mallory",
        "algorithm 'RS512' not accepted (only RS256)",
        None,
    ),
    "another audience": (
        lambda d: d.globex.token(
            "globex-1", d.claims("mallory", "globex", "support", aud="https://other.example")
        ),
        "mallory",
        "wrong audience 'https://other.example'",
        None,
    ),
    "the same kid on two issuers": (
        same_kid_on_two_issuers,
        "alice",
        "key id 'acme-1' belongs to two session issuers",
        "globex",
    ),
}


@pytest.mark.parametrize(("make", "user", "reason", "refreshed"), CASES.values(), ids=list(CASES))
def test_refused_with_nothing_run(
    issuer_deployment: Deployment,
    make: Callable[[Deployment], str],
    user: str,
    reason: str,
    refreshed: str | None,
) -> None:
    d = issuer_deployment
    token = make(d)
    effects = len(d.gate.effects())
    fetches = {"acme": d.acme.jwks_fetches(), "globex": d.globex.jwks_fetches()}
    answer = d.create(token, user)
    if refreshed is not None:
        server = d.acme if refreshed == "acme" else d.globex
        assert server.jwks_fetches() > fetches[refreshed]
    assert answer["outcome"] == "unauthenticated", answer
    assert answer["error"]["code"] == "unauthenticated"
    assert reason.format(globex=d.globex.issuer) in answer["error"]["message"], answer
    logged = [
        e.event_type
        for e in d.gate.backend.read_events()
        if e.invocation_id == answer["invocation_id"]
    ]
    assert "ProposalRejected" in logged and not RAN & set(logged), logged
    assert len(d.gate.effects()) == effects
