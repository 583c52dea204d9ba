"""A non-development identity provider, end to end on the embedded backend (ADR 0013).

The test generates the provider's keys with ``callgate keys generate`` (PEM key pairs and
a JWKS file), names them in ``callgate.toml`` and signs session tokens as the provider
would; every ``callgate`` command runs without development mode. Then it rotates the
provider's keys: a second kid joins the JWKS (both accepted), the first leaves it (its
tokens are refused).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.helpers import EXIT_FAILED, run
from tests.idp import IdentityProvider

pytestmark = pytest.mark.e2e

BIG_REFUND = {"order_id": "ORD-77", "amount_cents": 25000, "currency": "EUR"}  # high impact


def cg(state: Path, *args: str, rc: int = 0) -> dict[str, object]:
    """``callgate --json --state-dir S ARGS`` in production mode (callgate.toml in S)."""
    value = run(state, *args, rc=rc, dev=False).value
    assert isinstance(value, dict)
    return value


def propose(
    state: Path, token: str, tool: str, args: dict[str, object], *extra: str
) -> dict[str, object]:
    return cg(
        state, "propose", "--session", token, "--tool", tool, "--args", json.dumps(args), *extra
    )


def keys_generate(kind: str, alg: str, kid: str, out: Path) -> None:
    run(None, "keys", "generate", "--kind", kind, "--alg", alg, "--kid", kid, "--out", str(out))


def test_tokens_of_a_configured_issuer_and_its_key_rotation(tmp_path: Path) -> None:
    idp = IdentityProvider(tmp_path / "idp")
    keys_generate("session", "ES256", "idp-1", idp.keys)
    keys_generate("approval", "EdDSA", "apr-1", tmp_path / "approvals")
    state = tmp_path / "state"
    state.mkdir()
    (state / "callgate.toml").write_text(
        idp.config(("ES256", "RS256"), tmp_path / "approvals", "apr-1")
    )
    check = cg(state, "config", "check")
    assert check["development_mode"] is False

    alice = idp.token("idp-1", "alice", "acme", "support")
    bob = idp.token("idp-1", "bob", "acme", "finance-approver")
    read = propose(state, alice, "tickets.read", {"ticket_id": "T-1"})
    assert read["outcome"] == "executed", read

    # A high-impact refund: dry-run, approval by another user of the provider, execution.
    first = propose(state, alice, "refunds.issue", BIG_REFUND, "--idempotency-key", "r-7")
    assert first["outcome"] == "approval_required", first
    approval = cg(state, "approve", str(first["invocation_id"]), "--session", bob)
    assert approval["outcome"] == "executed", approval  # no resubmission (ADR 0029)
    done = cg(state, "wait", str(first["invocation_id"]), "--session", alice)
    assert done["outcome"] == "executed", done
    again = propose(state, alice, "refunds.issue", BIG_REFUND, "--idempotency-key", "r-7")
    assert again["outcome"] == "replayed" and again["result"] == done["result"]

    # Without development mode, development tokens are refused; so is `session issue`.
    dev_token = run(state, "session", "issue", "--user", "mallory", "--tenant", "acme",
                    "--roles", "finance-approver").value["token"]  # fmt: skip
    refused = propose(state, dev_token, "tickets.read", {"ticket_id": "T-1"})
    assert refused["outcome"] == "unauthenticated", refused
    run(state, "session", "issue", "--user", "u", "--tenant", "acme", dev=False, rc=EXIT_FAILED)
    # An algorithm not allowed for the issuer is refused even with a known kid.
    keys_generate("session", "EdDSA", "idp-x", idp.keys)
    failed = run(state, "config", "check", dev=False, rc=2)
    assert (
        "'idp-x' is EdDSA, not among the allowed (ES256, RS256)"
        in (failed.value["error"]["message"])
    )
    jwks = json.loads(idp.jwks.read_text())
    idp.jwks.write_text(json.dumps({"keys": [k for k in jwks["keys"] if k["kid"] != "idp-x"]}))

    # Rotation, step 1: idp-2 joins the JWKS; tokens of both kids are accepted.
    keys_generate("session", "RS256", "idp-2", idp.keys)
    new_alice = idp.token("idp-2", "alice", "acme", "support")
    for token in (alice, new_alice):
        answer = propose(state, token, "tickets.read", {"ticket_id": "T-2"})
        assert answer["outcome"] == "executed", answer
    # Step 2: idp-1 leaves the JWKS; its tokens are refused, idp-2's still work.
    jwks = json.loads(idp.jwks.read_text())
    idp.jwks.write_text(json.dumps({"keys": [k for k in jwks["keys"] if k["kid"] != "idp-1"]}))
    old = propose(state, alice, "tickets.read", {"ticket_id": "T-3"})
    assert old["outcome"] == "unauthenticated"
    assert "unknown key id 'idp-1'" in str(old["error"])
    assert propose(state, new_alice, "tickets.read", {"ticket_id": "T-3"})["outcome"] == "executed"
    # A token of the right kid from another issuer name is refused.
    stranger = IdentityProvider(idp.keys, issuer="https://other.example")
    wrong = propose(state, stranger.token("idp-2", "alice", "acme", "support"), "tickets.read",
                    {"ticket_id": "T-3"})  # fmt: skip
    assert wrong["outcome"] == "unauthenticated" and "wrong issuer" in str(wrong["error"])
