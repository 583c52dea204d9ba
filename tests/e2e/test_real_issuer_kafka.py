"""A non-development identity provider on the Kafka backend, end to end.

``callgate serve`` runs without development mode, with a ``callgate.toml`` naming the
test's identity provider (keys from ``callgate keys generate``, a JWKS file) and shared
approval keys. Its tokens work through the whole pipeline (a high-impact refund through
approval and execution); a development token is ``unauthenticated`` there.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from callgate.bootstrap import Settings, bootstrap
from callgate.domain.scope import OPERATOR_ROLE
from tests.e2e.helpers import callgate_argv
from tests.idp import IdentityProvider
from tests.kafka_support import Deployment, KafkaServe, unique_prefix

pytestmark = [pytest.mark.kafka, pytest.mark.e2e]

BIG_REFUND = {"order_id": "ORD-77", "amount_cents": 25000, "currency": "EUR"}


def keys_generate(kind: str, alg: str, kid: str, out: Path) -> None:
    argv = [*callgate_argv(), "keys", "generate", "--kind", kind, "--alg", alg, "--kid", kid]
    subprocess.run([*argv, "--out", str(out)], check=True, capture_output=True)


def test_serve_on_kafka_trusts_the_configured_issuer_and_refuses_dev_tokens(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    idp = IdentityProvider(tmp_path / "idp")
    keys_generate("session", "ES256", "idp-1", idp.keys)
    keys_generate("approval", "ES256", "apr-1", tmp_path / "approvals")
    conf = tmp_path / "callgate.toml"
    conf.write_text(idp.config(("ES256",), tmp_path / "approvals", "apr-1"))
    dep = Deployment(
        kafka_bootstrap, unique_prefix("idp"), tmp_path / "state", dev=False, config=conf
    )
    server = KafkaServe(dep, tmp_path / "serve.log")
    try:
        server.wait_ready(
            probe=idp.token("idp-1", "probe", "acme", "support"),
            reader=idp.token("idp-1", "operator", "ops", OPERATOR_ROLE),
        )
        assert "development mode" not in server.log.read_text()
        gate = dep.connect()
        try:
            alice = idp.token("idp-1", "alice", "acme", "support")
            bob = idp.token("idp-1", "bob", "acme", "finance-approver")
            first = gate.propose(alice, "refunds.issue", BIG_REFUND, "r-1", timeout_s=60)
            assert first["outcome"] == "approval_required", first
            approval = gate.approve(first["invocation_id"], bob, timeout_s=60)
            assert approval["approval_id"].count(".") == 2
            done = gate.propose(
                alice, "refunds.issue", BIG_REFUND, "r-1",
                approval_id=approval["approval_id"], timeout_s=60,
            )  # fmt: skip
            assert done["outcome"] == "executed", done

            # A development token minted on the same state directory is refused by serve.
            dev_app = bootstrap(Settings(state_dir=dep.state_dir, dev=True))
            mallory = dev_app.session_issuer.issue("mallory", "acme", ["support"], gate.app.clock())
            refused = gate.propose(mallory, "tickets.read", {"ticket_id": "T-1"}, timeout_s=60)
            assert refused["outcome"] == "unauthenticated", refused
        finally:
            gate.close()
    finally:
        code = server.stop()
    assert code == 0, server.log.read_text()
