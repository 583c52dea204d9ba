"""Two customers' identity providers, end to end through the command line (ADR 0078):
acme's provider and globex's, each bound to its tenant in ``callgate.toml``. A token of
globex's provider that says ``tenant: acme`` reads nothing of acme's; one that grants
itself the operator role freezes nothing. Production mode, embedded backend.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from callgate.domain.scope import OPERATOR_ROLE
from tests.e2e.helpers import run
from tests.e2e.test_freeze import freeze_count
from tests.e2e.test_real_issuer import cg, keys_generate, propose
from tests.idp import IdentityProvider

pytestmark = pytest.mark.e2e


def test_an_issuer_asserts_only_its_own_tenants_and_roles(tmp_path: Path) -> None:
    acme = IdentityProvider(tmp_path / "acme-idp", issuer="https://login.acme.example")
    globex = IdentityProvider(tmp_path / "globex-idp", issuer="https://login.globex.example")
    keys_generate("session", "ES256", "acme-1", acme.keys)
    keys_generate("session", "ES256", "globex-1", globex.keys)
    state = tmp_path / "state"
    state.mkdir()
    (state / "callgate.toml").write_text(
        "[[sessions.issuers]]\n"
        f'issuer = "{acme.issuer}"\n'
        f'jwks_file = "{acme.jwks}"\n'
        'algorithms = ["ES256"]\n'
        'tenants = ["acme", "ops"]\n'
        "operators = true\n"
        "[[sessions.issuers]]\n"
        f'issuer = "{globex.issuer}"\n'
        f'jwks_file = "{globex.jwks}"\n'
        'algorithms = ["ES256"]\n'
        'tenants = ["globex"]\n'
        'roles = ["support", "finance-approver"]\n'
    )
    alice = acme.token("acme-1", "alice", "acme", "support")
    assert propose(state, alice, "tickets.read", {"ticket_id": "T-1"})["outcome"] == "executed"

    # globex's provider says tenant acme: unauthenticated, nothing read.
    mallory = globex.token("globex-1", "mallory", "acme", "support")
    read = propose(state, mallory, "tickets.read", {"ticket_id": "T-1"})
    assert read["outcome"] == "unauthenticated", read
    assert "may not assert tenant 'acme'" in json.dumps(read["error"])
    assert "rule 'tenants'" in json.dumps(read["error"])
    assert "result" not in read or not read["result"]

    # globex's provider grants itself the operator role: the freeze is refused, not applied.
    operator = globex.token("globex-1", "mallory", "globex", OPERATOR_ROLE)
    freeze = run(state, "freeze", "--tenant", "acme", "--reason", "r", "--session", operator,
                 rc=None, dev=False).value  # fmt: skip
    assert freeze["error"]["code"] == "unauthenticated", freeze
    assert "rule 'operators'" in freeze["error"]["message"]
    assert freeze_count(state) == 0
    ticket: dict[str, object] = {"title": "t", "requester_id": "alice"}
    assert propose(state, alice, "tickets.create", ticket)["outcome"] == "executed"

    # A role outside globex's allowed set, and ACME for acme, are refused the same way.
    admin = propose(state, globex.token("globex-1", "g", "globex", "admin"), "tickets.read",
                    {"ticket_id": "T-9"})  # fmt: skip
    assert admin["outcome"] == "unauthenticated" and "rule 'roles'" in json.dumps(admin["error"])
    upper = propose(state, acme.token("acme-1", "alice", "ACME", "support"), "tickets.read",
                    {"ticket_id": "T-1"})  # fmt: skip
    assert upper["outcome"] == "unauthenticated", upper

    # acme's own operator may freeze acme.
    olga = acme.token("acme-1", "olga", "ops", OPERATOR_ROLE)
    cg(state, "freeze", "--tenant", "acme", "--reason", "incident", "--session", olga)
    assert freeze_count(state) == 1
    assert propose(state, alice, "tickets.create", ticket)["outcome"] == "frozen"
