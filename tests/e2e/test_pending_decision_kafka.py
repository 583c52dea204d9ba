"""A call no policy decided is never answered ``allowed`` (docs/contract.md, "Vocabulary":
``pending_decision``), on every surface, on Apache Kafka.

The deployment's topics exist but no ``invocations`` worker runs (``serve --only`` a
projection, or no serve at all): a proposal is published and nothing decides it. The SDK,
the command line, the HTTP API and the MCP surface each answer ``pending_decision``, not
settled; ``status`` and ``wait`` of the invocation say the same instead of ``not_found``;
another session, which did not form the id, still gets ``not_found``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import mcp
import pytest

from callgate.adapters.kafka.serve import create_topics
from callgate.bootstrap import bootstrap
from tests.e2e.helpers import CALLGATE, cli_env
from tests.http_support import HttpServe
from tests.kafka_support import Deployment, cli, token, unique_prefix

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

UNDECIDED = "pending_decision"
READ = {"ticket_id": "T-1"}


@pytest.fixture(scope="module")
def undecided(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Deployment:
    """A deployment whose topics exist and whose deciders never run."""
    root = tmp_path_factory.mktemp("undecided")
    dep = Deployment(kafka_bootstrap, unique_prefix("undecided"), root / "state")
    create_topics(bootstrap(dep.settings()))
    return dep


def test_sdk_answers_pending_decision_never_allowed(undecided: Deployment) -> None:
    gate = undecided.connect()
    try:
        alice = token(gate, "alice", "acme", "support")
        answer = gate.propose(alice, "tickets.read", READ, timeout_s=2.0)
        assert answer["outcome"] == UNDECIDED and answer["settled"] is False, answer
        assert answer["error"]["code"] == UNDECIDED
        inv = answer["invocation_id"]
        assert gate.status(inv, alice) is None  # nothing recorded of it
        status = gate.status_or_undecided(inv, alice)
        assert status is not None and status["outcome"] == UNDECIDED, status
        waited = gate.wait(inv, alice, 1.0)
        assert waited["outcome"] == UNDECIDED and waited["final"] is False, waited
        mallory = token(gate, "mallory", "acme", "support")
        assert gate.status_or_undecided(inv, mallory) is None  # not formed by this session
    finally:
        gate.close()


def test_command_line_answers_pending_decision_never_allowed(undecided: Deployment) -> None:
    gate = undecided.connect()
    try:
        alice = token(gate, "alice", "acme", "support")
    finally:
        gate.close()
    run = cli(
        undecided, "propose", "--timeout", "2", "--session", alice, "--tool", "tickets.read",
        "--args", json.dumps(READ), rc=None,
    )  # fmt: skip
    assert run.returncode != 0, run
    answer = json.loads(run.stdout)
    assert answer["outcome"] == UNDECIDED and answer["settled"] is False, answer
    status = json.loads(
        cli(undecided, "status", answer["invocation_id"], "--session", alice).stdout
    )
    assert status["outcome"] == UNDECIDED, status


@pytest.fixture(scope="module")
def http_undecided(
    undecided: Deployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HttpServe]:
    """``serve --http`` running one projection: the API answers, nothing decides."""
    root = tmp_path_factory.mktemp("http-undecided")
    serve = HttpServe(
        undecided.state_dir, root / "serve.log", env=undecided.env(), dev=True,
        serve_args=["--only", "status-projection"],
    )  # fmt: skip
    try:
        serve.wait_ready(timeout_s=120)
        yield serve
    finally:
        assert serve.stop() == 0, serve.log.read_text()


def test_http_answers_pending_decision_never_allowed(http_undecided: HttpServe) -> None:
    alice = http_undecided.token("alice", "acme", "support")
    with http_undecided.client(alice) as c:
        r = c.post("/v1/proposals", params={"wait": 2}, json={"tool": "tickets.read", "args": READ})
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["outcome"] == UNDECIDED and body["settled"] is False, body
        got = c.get(r.headers["Location"])
        assert got.status_code == 200 and got.json()["outcome"] == UNDECIDED, got.text


@pytest.mark.anyio
async def test_mcp_answers_pending_decision_never_allowed(
    undecided: Deployment, anyio_backend: str
) -> None:
    gate = undecided.connect()
    try:
        alice = token(gate, "alice", "acme", "support")
    finally:
        gate.close()
    params = mcp.StdioServerParameters(
        command=str(CALLGATE),
        args=["mcp", "--session", alice, "--timeout", "2"],
        env={**cli_env(), **undecided.env()},
    )
    async with mcp.Client(params, cache=None) as c:
        result = await c.call_tool("tickets.read", READ)
    assert result.is_error, result
    assert isinstance(result.structured_content, dict), result
    assert result.structured_content["outcome"] == UNDECIDED, result.structured_content
