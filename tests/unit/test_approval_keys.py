"""Approval keys as configuration (C11; docs/reference/configuration.md, "Rotating the
approval key").

Every instance sharing a configuration verifies every other's approvals; a rotation
makes a new key active while the old one keeps verifying what it signed, until the old
kid is removed from the verification keys.
"""

from __future__ import annotations

import json
from pathlib import Path

import jwt
import pytest
from tests.harness import DAY_S, T0, Gate

from callgate.adapters.keyfiles import generate_key_pair, jwks_file
from callgate.bootstrap import Settings, bootstrap
from callgate.config import ConfigError
from callgate.config.sections import ApprovalSettings
from callgate.domain.approvals import ApprovalBinding, ApprovalClaims, ApprovalSigner
from callgate.domain.codes import Code, Rejection

BIG_REFUND = {"order_id": "ORD-77", "amount_cents": 25000, "currency": "EUR"}


def approvals(keys: Path, kid: str) -> ApprovalSettings:
    return ApprovalSettings(
        signing_kid=kid,
        signing_key_file=keys / f"{kid}.pem",
        jwks_file=jwks_file(keys, "approval"),
    )


def claims(jti: str) -> ApprovalClaims:
    binding = ApprovalBinding("acme", "alice", "refunds.issue", "ORD-1", "v", "a", "d", "k", "i")
    return ApprovalClaims(jti, binding, "bob", "approver", T0, T0 + 60_000)


def test_instances_sharing_a_configuration_verify_each_others_approvals(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate_key_pair(keys, "approval", "ES256", "apr-1")
    shared = approvals(keys, "apr-1")
    one = bootstrap(Settings(state_dir=tmp_path / "one", approvals=shared))
    two = bootstrap(Settings(state_dir=tmp_path / "two", approvals=shared))
    signed = ApprovalSigner(one.approval_keys.signing_key, "apr-1").sign(claims("apr-x"))
    assert jwt.get_unverified_header(signed)["alg"] == "ES256"
    two_verifier = two.decider().deps.approval_verifier
    assert two_verifier.verify(signed, T0).jti == "apr-x"

    # Without shared keys each state directory signs with a key of its own.
    alone = bootstrap(Settings(state_dir=tmp_path / "alone"))
    other = bootstrap(Settings(state_dir=tmp_path / "other"))
    theirs = ApprovalSigner(alone.approval_keys.signing_key, alone.approval_keys.signing_kid)
    with pytest.raises(Rejection) as err:
        other.decider().deps.approval_verifier.verify(theirs.sign(claims("apr-y")), T0)
    assert err.value.code is Code.APPROVAL_MISSING


def test_rotation_keeps_old_approvals_verifying_until_the_old_kid_is_removed(
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys"
    generate_key_pair(keys, "approval", "EdDSA", "apr-1")
    gate = Gate(tmp_path / "state", approvals=approvals(keys, "apr-1"))
    alice = gate.session("alice", roles=("support",), ttl=DAY_S)
    bob = gate.session("bob", roles=("finance-approver",), ttl=DAY_S)

    first = gate.propose(alice, "refunds.issue", BIG_REFUND, key="r-1")
    second = gate.propose(alice, "refunds.issue", {**BIG_REFUND, "order_id": "ORD-78"}, key="r-2")
    assert gate.outcome(first) == gate.outcome(second) == "approval_required"
    old_1, old_2 = gate.approve(bob, first), gate.approve(bob, second)
    assert jwt.get_unverified_header(old_1)["kid"] == "apr-1"

    # Rotate: apr-2 becomes the active key; apr-1 stays in the JWKS.
    generate_key_pair(keys, "approval", "RS256", "apr-2")
    gate = gate.redeploy(approvals=approvals(keys, "apr-2"))
    done = gate.propose(alice, "refunds.issue", BIG_REFUND, key="r-1", approval_id=old_1)
    assert gate.outcome(done) == "executed"
    third = gate.propose(alice, "refunds.issue", {**BIG_REFUND, "order_id": "ORD-79"}, key="r-3")
    new = gate.approve(bob, third)
    assert jwt.get_unverified_header(new) == {
        "alg": "RS256",
        "kid": "apr-2",
        "typ": "callgate-approval+jwt",
    }

    # Retire apr-1 (its approvals have expired in a real rotation): what it signed fails.
    document = jwks_file(keys, "approval")
    doc = json.loads(document.read_text())
    document.write_text(json.dumps({"keys": [k for k in doc["keys"] if k["kid"] != "apr-1"]}))
    gate = gate.redeploy(approvals=approvals(keys, "apr-2"))
    stale = gate.propose(
        alice, "refunds.issue", {**BIG_REFUND, "order_id": "ORD-78"}, key="r-2", approval_id=old_2
    )
    assert gate.outcome(stale) == "approval_missing"
    assert "unknown key id 'apr-1'" in gate.status(stale)["error"]["message"]
    confirmed = gate.propose(
        alice, "refunds.issue", {**BIG_REFUND, "order_id": "ORD-79"}, key="r-3", approval_id=new
    )
    assert gate.outcome(confirmed) == "executed"
    assert len(gate.effects()) == 2


def test_a_signing_key_that_disagrees_with_the_jwks_is_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    generate_key_pair(keys, "approval", "EdDSA", "apr-1")
    generate_key_pair(tmp_path / "elsewhere", "approval", "EdDSA", "apr-1")
    elsewhere = tmp_path / "elsewhere" / "apr-1.pem"
    conf = approvals(keys, "apr-1").model_copy(update={"signing_key_file": elsewhere})
    app = bootstrap(Settings(state_dir=tmp_path / "s", approvals=conf))
    with pytest.raises(ConfigError, match="names another public key"):
        app.approval_keys  # noqa: B018
