"""Delegated identity to upstreams (issue 38.5, ADR 0081), over real HTTP on loopback: an
HTTP provider and an upstream MCP server (streamable HTTP) that log the ``Authorization``
header they receive, and an authorization server's token endpoint (``tests/token_server``).

Shown: the upstream gets a token for its audience whose subject is the user and whose
``act`` names callgate (with the session's own chain under it), never the caller's token;
tokens are cached per subject and audience until shortly before they expire; a refused
exchange is ``token_exchange_failed`` with nothing sent upstream; client credentials for a
service-level upstream. The same against Keycloak: ``tests/keycloak`` (``make
test-keycloak``)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from tests.mcp_support import effects, heard, http_upstream, write_profile
from tests.token_server import LoggingProvider, TokenServer

from callgate.adapters.keyfiles import generate_private_key, private_pem
from callgate.bootstrap import Settings, bootstrap
from callgate.domain.catalog import ProfileError, default_profile_path
from callgate.domain.keys import PrivateKey
from callgate.providers.upstream_tokens import (
    Acting,
    TokenExchangeFailed,
    UpstreamTokenConfig,
    UpstreamTokens,
    acting_for,
)
from callgate.surfaces.sdk import Gateway, connect

SECRET = "callgate-secret-at-the-as"
ASSERTION_ISSUER = "https://callgate.acme.example"
ACT = {"sub": "planner", "act": {"sub": "orchestrator"}}


@pytest.fixture
def assertion_key() -> PrivateKey:
    return generate_private_key("RS256")


@pytest.fixture
def authorization_server(assertion_key: PrivateKey) -> Iterator[TokenServer]:
    server = TokenServer(
        generate_private_key("ES256"),
        {"callgate": SECRET},
        {ASSERTION_ISSUER: assertion_key.public_key()},
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def provider() -> Iterator[LoggingProvider]:
    server = LoggingProvider()
    try:
        yield server
    finally:
        server.stop()


def upstream_token(
    folder: Path, server: TokenServer, key: PrivateKey, audience: str, grant: str
) -> dict[str, Any]:
    """The ``upstream_token:`` settings an adopter writes, secrets in files."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "as-secret").write_text(SECRET)
    (folder / "assertion.pem").write_bytes(private_pem(key))
    settings: dict[str, Any] = {
        "grant": grant,
        "token_endpoint": server.token_endpoint,
        "client_id": "callgate",
        "client_secret": {"file": "as-secret"},
        "audience": audience,
        "scopes": [f"{audience}.read", f"{audience}.write"],
    }
    if grant == "token_exchange":
        settings["subject"] = {
            "issuer": ASSERTION_ISSUER,
            "audience": server.issuer,
            "key": {"file": "assertion.pem"},
            "kid": "callgate-assertion-1",
        }
    return settings


def crm_profile(folder: Path, base_url: str, token: dict[str, Any]) -> Path:
    """The shipped profile plus ``crm.read`` and ``crm.create`` on an HTTP provider."""
    source = default_profile_path()
    raw = yaml.safe_load(source.read_text())
    raw["providers"]["crm"] = {"kind": "http", "base_url": base_url, "upstream_token": token}
    schema = {"type": "object", "required": ["contact_id"], "additionalProperties": False,
              "properties": {"contact_id": {"type": "string", "minLength": 1}}}  # fmt: skip
    common: dict[str, Any] = {"provider": "crm", "callers": ["support"], "impact": "low",
                              "require_dry_run": False, "confirmation": "none"}  # fmt: skip
    raw["tools"]["crm.read"] = {**common, "mutation": False, "target_arg": "contact_id",
                                "args_schema": schema}  # fmt: skip
    raw["tools"]["crm.create"] = {**common, "mutation": True, "target_arg": None,
                                  "args_schema": {**schema, "required": []}}  # fmt: skip
    raw["resources"]["acme"].append("C-*")
    shutil.copy(source.parent / raw["policy_file"], folder / raw["policy_file"])
    path = folder / "profile.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def claims_of(authorization: str | None, server: TokenServer) -> dict[str, Any]:
    assert authorization is not None and authorization.startswith("Bearer ")
    key = server.key.public_key()
    found: dict[str, Any] = jwt.decode(
        authorization[7:], key, algorithms=["ES256"], options={"verify_aud": False}
    )
    return found


def test_the_http_provider_sends_a_token_exchanged_for_the_user_never_the_callers(
    tmp_path: Path,
    authorization_server: TokenServer,
    provider: LoggingProvider,
    assertion_key: PrivateKey,
) -> None:
    folder = tmp_path / "profile"
    token = upstream_token(folder, authorization_server, assertion_key, "crm", "token_exchange")
    gate = connect(
        Settings(
            state_dir=tmp_path / "state", profile=crm_profile(folder, provider.url, token), dev=True
        )
    )
    try:
        issue = gate.app.session_issuer.issue
        session = {"azp": "agent-cli", "act": ACT}
        alice = issue("alice", "acme", ["support"], gate.app.clock(), extra=session)
        first = gate.propose(alice, "crm.read", {"contact_id": "C-1"})
        second = gate.propose(alice, "crm.create", {})
        bob = issue("bob", "acme", ["support"], gate.app.clock())
        third = gate.propose(bob, "crm.read", {"contact_id": "C-2"})
    finally:
        gate.close()
    assert [a["outcome"] for a in (first, second, third)] == ["executed"] * 3, (first, second)
    executes = [auth for path, auth in provider.heard if path == "/execute"]
    assert len(executes) == 3
    for auth in executes:
        assert auth is not None and alice not in auth and bob not in auth
    by_user = {claims_of(auth, authorization_server)["sub"]: auth for auth in executes}
    claims = claims_of(by_user["alice"], authorization_server)
    assert claims["aud"] == "crm" and claims["scope"] == "crm.read crm.write"
    # callgate is the actor; the session's own chain is kept under it.
    assert claims["act"] == {"sub": "callgate", "act": ACT}
    assert claims_of(by_user["bob"], authorization_server)["act"] == {"sub": "callgate"}
    # Cached per subject and audience: one exchange for alice's two calls, one for bob.
    exchanges = [r for r in authorization_server.requests if "subject_token" in r]
    assert len(exchanges) == 2
    subject = jwt.decode(
        exchanges[0]["subject_token"],
        assertion_key.public_key(),
        algorithms=["RS256"],
        audience=authorization_server.issuer,
    )
    assert (subject["iss"], subject["sub"], subject["tenant"]) == (
        ASSERTION_ISSUER,
        "alice",
        "acme",
    )
    assert subject["act"] == ACT and subject["agent"] == "agent-cli"


def test_a_refused_exchange_is_token_exchange_failed_and_the_upstream_is_never_called(
    tmp_path: Path,
    authorization_server: TokenServer,
    provider: LoggingProvider,
    assertion_key: PrivateKey,
) -> None:
    folder = tmp_path / "profile"
    token = upstream_token(folder, authorization_server, assertion_key, "crm", "token_exchange")
    profile = crm_profile(folder, provider.url, token)
    authorization_server.refuse = True
    gate = connect(Settings(state_dir=tmp_path / "state", profile=profile, dev=True))
    try:
        alice = gate.app.session_issuer.issue("alice", "acme", ["support"], gate.app.clock())
        answer = gate.propose(alice, "crm.create", {}, idempotency_key="k-1")
        status = gate.status(answer["invocation_id"], alice)
    finally:
        gate.close()
    assert answer["outcome"] == "token_exchange_failed", answer
    assert "invalid_grant" in answer["error"]["message"]
    assert status is not None and status["outcome"] == "token_exchange_failed"
    assert [path for path, _ in provider.heard if path == "/execute"] == []
    assert provider.applied == {}


def test_client_credentials_for_a_service_level_upstream(
    tmp_path: Path,
    authorization_server: TokenServer,
    provider: LoggingProvider,
    assertion_key: PrivateKey,
) -> None:
    folder = tmp_path / "profile"
    token = upstream_token(folder, authorization_server, assertion_key, "crm", "client_credentials")
    profile = crm_profile(folder, provider.url, token)
    gate = connect(Settings(state_dir=tmp_path / "state", profile=profile, dev=True))
    try:
        alice = gate.app.session_issuer.issue("alice", "acme", ["support"], gate.app.clock())
        for contact in ("C-1", "C-2"):
            assert gate.propose(alice, "crm.read", {"contact_id": contact})["outcome"] == "executed"
    finally:
        gate.close()
    auths = {auth for path, auth in provider.heard if path == "/execute"}
    assert len(auths) == 1  # one token, cached
    claims = claims_of(auths.pop(), authorization_server)
    assert (claims["sub"], claims["aud"]) == ("callgate", "crm") and "act" not in claims
    assert [r["grant_type"] for r in authorization_server.requests] == ["client_credentials"]


def test_tokens_are_cached_until_shortly_before_they_expire(
    tmp_path: Path, authorization_server: TokenServer, assertion_key: PrivateKey
) -> None:
    folder = tmp_path / "c"
    settings = upstream_token(folder, authorization_server, assertion_key, "crm", "token_exchange")
    config = UpstreamTokenConfig.model_validate({**settings, "refresh_before_s": 30})
    now = [time.time()]
    tokens = UpstreamTokens("crm", config, SECRET, assertion_key, clock=lambda: now[0])
    authorization_server.expires_in = 300
    authorization_server.leeway_s = 600  # the assertions are signed at the test's clock
    alice, bob = Acting("alice", "acme"), Acting("bob", "acme")
    with acting_for(alice):
        first = tokens.token()
        now[0] += 269  # 31 s left: still used
        assert tokens.token() == first
    with acting_for(bob):
        assert tokens.token() != first  # another subject, another token
    with acting_for(alice):
        now[0] += 1  # 30 s left: refreshed
        tokens.token()
    assert len(authorization_server.requests) == 3
    with pytest.raises(TokenExchangeFailed, match="no verified user"):
        tokens.token()  # outside any call: fails closed, asks nobody
    assert len(authorization_server.requests) == 3


@pytest.mark.parametrize(
    ("answer", "secret", "why"),
    [
        ({"token_type": "Bearer", "expires_in": 60}, SECRET, "has no access_token"),
        (
            {"access_token": "x", "issued_token_type": "urn:ietf:params:oauth:token-type:id_token"},
            SECRET,
            "not an access token",
        ),
        (None, "not-the-secret", "invalid_client"),
    ],
)
def test_an_unusable_answer_of_the_authorization_server_fails_closed(
    tmp_path: Path,
    authorization_server: TokenServer,
    assertion_key: PrivateKey,
    answer: dict[str, Any] | None,
    secret: str,
    why: str,
) -> None:
    settings = upstream_token(
        tmp_path, authorization_server, assertion_key, "crm", "token_exchange"
    )
    config = UpstreamTokenConfig.model_validate(settings)
    tokens = UpstreamTokens("crm", config, secret, assertion_key)
    authorization_server.answer_with = answer
    with acting_for(Acting("alice", "acme")), pytest.raises(TokenExchangeFailed, match=why):
        tokens.token()


def test_an_unreachable_authorization_server_fails_closed(
    tmp_path: Path, authorization_server: TokenServer, assertion_key: PrivateKey
) -> None:
    settings = upstream_token(
        tmp_path, authorization_server, assertion_key, "crm", "token_exchange"
    )
    settings["token_endpoint"] = "http://127.0.0.1:9/token"
    tokens = UpstreamTokens(
        "crm", UpstreamTokenConfig.model_validate(settings), SECRET, assertion_key
    )
    with (
        acting_for(Acting("alice", "acme")),
        pytest.raises(TokenExchangeFailed, match=r"127\.0\.0\.1:9"),
    ):
        tokens.token()


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"subject": None}, "needs 'subject'"),
        ({"parameters": {"audience": "other"}}, "may not set audience"),
        ({"credentials": {"env": "CRM_TOKEN"}}, "either 'credentials' or 'upstream_token'"),
    ],
)
def test_misconfigured_upstream_tokens_stop_the_start_naming_the_key(
    tmp_path: Path,
    authorization_server: TokenServer,
    assertion_key: PrivateKey,
    change: dict[str, Any],
    why: str,
) -> None:
    folder = tmp_path / "profile"
    token = upstream_token(folder, authorization_server, assertion_key, "crm", "token_exchange")
    profile = crm_profile(folder, "http://127.0.0.1:9", token)
    raw = yaml.safe_load(profile.read_text())
    crm = raw["providers"]["crm"]
    for key, value in change.items():
        if key == "credentials":
            crm[key] = value
        else:
            crm["upstream_token"][key] = value
    profile.write_text(yaml.safe_dump(raw))
    # What a start builds (``serve``, or a client that runs the processes): the providers.
    app = bootstrap(Settings(state_dir=tmp_path / "state", profile=profile, dev=True))
    with pytest.raises(ProfileError, match=r"providers\.crm") as info:
        _ = app.providers
    assert why in str(info.value)


def notes_gate(
    tmp_path: Path, url: str, ledger: Path, server: TokenServer, key: PrivateKey
) -> Gateway:
    folder = tmp_path / "profile"
    profile = write_profile(folder, ledger, url=url, timeout_s=5.0)
    raw = yaml.safe_load(profile.read_text())
    token = upstream_token(folder, server, key, "notes", "token_exchange")
    raw["providers"]["notes"]["upstream_token"] = token
    profile.write_text(yaml.safe_dump(raw, sort_keys=False))
    return connect(Settings(state_dir=tmp_path / "state", profile=profile, dev=True))


def test_the_mcp_upstream_gets_a_token_exchanged_for_the_user_never_the_callers(
    tmp_path: Path, authorization_server: TokenServer, assertion_key: PrivateKey
) -> None:
    ledger = tmp_path / "notes.jsonl"
    with http_upstream(ledger, tmp_path / "upstream.log") as url:
        gate = notes_gate(tmp_path, url, ledger, authorization_server, assertion_key)
        try:
            alice = gate.app.session_issuer.issue(
                "alice", "acme", ["support"], gate.app.clock(), extra={"azp": "agent-cli"}
            )
            note = {"note_id": "N-1", "text": "hello"}
            wrote = gate.propose(alice, "notes.quick_write", note, idempotency_key="w-1")
            read = gate.propose(alice, "notes.read", {"note_id": "N-1"})
            authorization_server.refuse = True  # bob has no cached token: asked, refused
            bob = gate.app.session_issuer.issue("bob", "acme", ["support"], gate.app.clock())
            refused = gate.propose(
                bob, "notes.quick_write", {"note_id": "N-2", "text": "x"}, idempotency_key="w-2"
            )
        finally:
            gate.close()
    assert wrote["outcome"] == "executed", wrote
    assert read["outcome"] == "executed", read
    assert refused["outcome"] == "token_exchange_failed", refused
    calls = [h for h in heard(ledger) if h["tool"] in ("write_note", "read_note")]
    assert [h["tool"] for h in calls] == ["write_note", "read_note"]  # none for N-2
    for call in calls:
        assert alice not in call["authorization"]
        claims = claims_of(call["authorization"], authorization_server)
        assert (claims["sub"], claims["aud"]) == ("alice", "notes")
        assert claims["act"] == {"sub": "callgate"}
    assert [e["note_id"] for e in effects(ledger)] == ["N-1"]
