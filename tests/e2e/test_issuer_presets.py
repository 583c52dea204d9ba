"""Tokens shaped as Entra ID, Okta, Auth0 and Keycloak issue them, accepted through the
presets on every surface an agent uses (ADR 0078), in production mode on the embedded
backend: the command line (``callgate propose``), the Python SDK (``Gateway``), the HTTP
API (``callgate serve --http``, a real server) and MCP (``callgate mcp`` over stdio and
streamable HTTP, driven by the MCP SDK's client). Each provider publishes its discovery
document and keys over real HTTP (``tests.provider_shapes``); one ``callgate.toml``
trusts all four, each bound to its tenant. A call made with each token executes, and its
audit record names the mapped user, tenant, roles and agent.

The console's sign-in with Entra- and Okta-shaped ID tokens is in
tests/http/test_console_oidc_presets.py (browser tier). Between commands a provider
rotates its keys (the last test).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import mcp
import pytest
from cryptography.hazmat.primitives.asymmetric.rsa import generate_private_key
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from tools.ports import free_port, wait_port

from callgate.bootstrap import Settings
from callgate.surfaces.sdk import connect
from tests.e2e.helpers import CALLGATE, cli_env
from tests.e2e.test_real_issuer import propose
from tests.http_support import HttpServe, running
from tests.jwks_server import KeyServer
from tests.provider_shapes import (
    ENTRA_TID,
    PRESET_IDS,
    SHAPES,
    Providers,
    Shape,
    production_state,
    recorded_principal,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def providers() -> Iterator[Providers]:
    p = Providers()
    try:
        yield p
    finally:
        p.stop()


# --- the command line and the SDK ---------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=PRESET_IDS)
def test_the_command_line_accepts_each_providers_token(
    providers: Providers, shape: Shape, tmp_path: Path
) -> None:
    state = production_state(tmp_path / "state", providers)
    answer = propose(state, providers.token(shape), "tickets.create", shape.ticket())
    assert answer["outcome"] == "executed", answer
    assert recorded_principal(state, str(answer["invocation_id"])) == shape.principal()


@pytest.mark.parametrize("shape", SHAPES, ids=PRESET_IDS)
def test_the_sdk_accepts_each_providers_token(
    providers: Providers, shape: Shape, tmp_path: Path
) -> None:
    state = production_state(tmp_path / "state", providers)
    settings = Settings.from_env(config_file=state / "callgate.toml", environ={}, state_dir=state)
    assert not settings.dev
    gate = connect(settings)
    try:
        answer = gate.propose(providers.token(shape), "tickets.create", shape.ticket())
    finally:
        gate.close()
    assert answer["outcome"] == "executed", answer
    assert recorded_principal(state, answer["invocation_id"]) == shape.principal()


# --- HTTP ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http(providers: Providers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServe]:
    root = tmp_path_factory.mktemp("presets-http")
    serve = HttpServe(production_state(root / "state", providers), root / "serve.log")
    with running(serve):
        yield serve


@pytest.mark.parametrize("shape", SHAPES, ids=PRESET_IDS)
def test_the_http_api_accepts_each_providers_token(
    providers: Providers, http: HttpServe, shape: Shape
) -> None:
    with http.client(providers.token(shape)) as c:
        session = c.get("/v1/session").json()
        r = c.post("/v1/proposals", json={"tool": "tickets.create", "args": shape.ticket()})
    assert (session["user"], session["tenant"], session["roles"]) == (
        shape.user,
        shape.tenant,
        list(shape.roles),
    ), session
    assert r.status_code == 200 and r.json()["outcome"] == "executed", r.text
    assert recorded_principal(http.state_dir, r.json()["invocation_id"]) == shape.principal()


# --- MCP ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mcp_http(
    providers: Providers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, str]]:
    """``callgate mcp --http`` in production mode: its state directory and URL."""
    root = tmp_path_factory.mktemp("presets-mcp")
    state = production_state(root / "state", providers)
    port = free_port()
    log_path = root / "mcp-http.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [str(CALLGATE), "--state-dir", str(state), "mcp", "--http", f"127.0.0.1:{port}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=cli_env(dev=False),
        )
        try:
            wait_port(port, proc, log_path, 30)
            yield state, f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    assert "Traceback" not in log_path.read_text()


@contextlib.asynccontextmanager
async def mcp_client(
    transport: str, token: str, state: Path, url: str
) -> AsyncIterator[mcp.Client]:
    """The SDK's client on ``callgate mcp``: over stdio (a subprocess it spawns on
    ``state`` with the session), or over streamable HTTP at ``url``, the session as the
    bearer."""
    if transport == "stdio":
        params = mcp.StdioServerParameters(
            command=str(CALLGATE),
            args=["--state-dir", str(state), "mcp", "--session", token],
            env=cli_env(dev=False),
        )
        async with mcp.Client(params, cache=None) as client:
            yield client
        return
    http_client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with (
        http_client,
        mcp.Client(streamable_http_client(url, http_client=http_client), cache=None) as client,
    ):
        yield client


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("shape", SHAPES, ids=PRESET_IDS)
async def test_mcp_accepts_each_providers_token(
    providers: Providers,
    mcp_http: tuple[Path, str],
    shape: Shape,
    transport: str,
    tmp_path: Path,
) -> None:
    state, url = mcp_http
    if transport == "stdio":
        state = production_state(tmp_path / "state", providers)
    async with mcp_client(transport, providers.token(shape), state, url) as c:
        listed = {t.name for t in (await c.list_tools()).tools}
        result = await c.call_tool("tickets.create", shape.ticket())
    assert "tickets.create" in listed and "users.delete" not in listed  # support's tools
    assert not result.is_error, result
    assert result.meta is not None and result.meta["callgate/outcome"] == "executed", result
    invocation = str(result.meta["callgate/invocation_id"])
    assert recorded_principal(state, invocation) == shape.principal()


# --- a provider rotates its keys between commands -----------------------------------------


def rsa() -> Any:
    return generate_private_key(public_exponent=65537, key_size=2048)


def test_a_rotation_between_commands_needs_no_restart(tmp_path: Path) -> None:
    """Keycloak rotates its key; the next command fetches the new set: the old token is
    refused, a token of the new key accepted. An Entra token of another directory is
    refused beside it."""
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
            "[[sessions.issuers]]\n"
            f'issuer = "{keycloak.issuer}"\n'
            f'preset = "keycloak"\njwks_uri = "{keycloak.jwks_uri}"\n'
            'algorithms = ["RS256"]\ntenant = "acme"\n'
        )
        now = int(time.time())
        times = {"iat": now, "exp": now + 600}
        kc_claims = {
            **times, "aud": ["callgate", "account"], "azp": "agent-cli", "sub": "alice",
            "realm_access": {"roles": ["offline_access", "support"]},
        }  # fmt: skip
        read = propose(
            state, keycloak.token("kc-1", kc_claims), "tickets.read", {"ticket_id": "T-1"}
        )
        assert read["outcome"] == "executed", read

        other = entra.token("entra-1", {**times, "aud": "api://callgate", "tid": "other-dir",
                                        "oid": "o", "roles": []})  # fmt: skip
        refused = propose(state, other, "tickets.read", {"ticket_id": "T-1"})
        assert refused["outcome"] == "unauthenticated", refused
        assert "may not assert tenant 'other-dir'" in json.dumps(refused["error"])

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
