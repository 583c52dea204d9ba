"""Hypothesis strategies for hostile input: JSON, session tokens, envelopes.

What a hostile client can choose, all of it: the arguments' JSON text (non-finite and huge
numbers, too many digits, lone surrogates raw and escaped, deep nesting, duplicate keys,
huge strings, wrong types), the session token (genuine, expired, unsigned ``alg: none``
with strange claim values, HS256 with the public key, tampered, garbage headers), the tool
name, the idempotency key (shared across tenants), the invocation id (bound to its own
session, another session's, or anything) and the partition key (routed right, to another
tenant's key, or anywhere).

A ``Case`` is drawn without a deployment; ``realize`` turns it into a ``ToolCallProposed``
with that deployment's keys (``tests.fuzz.drive``).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

TENANTS = ("acme", "globex")
USERS = {"alice": ("acme", ("support",)), "gina": ("globex", ("support",))}
TOOLS = (
    "tickets.read",
    "tickets.create",
    "records.update",
    "refunds.issue",
    "deploys.trigger",
    "users.delete",
    "tickets.re\u0430d",  # Cyrillic a
    "",
    "x" * 300,
)
# Tools that run without any confirmation: the only ones whose calls may reach a provider
# in a campaign (it grants no approvals).
NO_CONFIRMATION = frozenset({"tickets.read", "tickets.create"})
SHARED_KEYS = ("K", "shared-key", "refund-1")
RITA_SPELLINGS = (
    "rita", "RITA", " rita ", "Rita", "\uff52\uff49\uff54\uff41", "\uff32ITA", "rita\t",
    "r\u0456ta",  # Cyrillic i: another person
    "rit\u0430",  # Cyrillic a: another person
    "rite",
)  # fmt: skip
# Tenants and roles a trusted issuer may sign (issue 25): other spellings of acme, globex
# and the roles, each another identifier; a campaign checks none is granted as the other.
TENANT_SPELLINGS = (
    "acme", "ACME", "Acme", "acme ", "\uff41\uff43\uff4d\uff45", "\u0430cme", "acme\u200b",
    "globex", "GLOBEX", "Globex", "gl\u043ebex", "\u212bcme", "ac\u00adme", "\ufeffacme",
)  # fmt: skip
ROLE_SPELLINGS = (
    "admin", "ADMIN", "Admin", " admin", "\uff41dmin", "\u0430dmin", "admin\u2060",
    "support", "Support", "release-manager", "Release-Manager", "release\u2010manager",
)  # fmt: skip

# -- JSON ------------------------------------------------------------------------------------

NUMBER_TOKENS = st.sampled_from(
    [
        "1e400", "-1e999", "1E+309", "123456789012345678901234567890", "9" * 5000, "-0",
        "0.1", "1.00000000000000000001", "1e-400", "9007199254740993", "9007199254740991",
        "NaN", "Infinity", "-Infinity", "1.5", "0", "-1", "3.14159265358979323846264338",
    ]
)  # fmt: skip
STRING_TOKENS = st.sampled_from(
    [
        '"\\ud800"', '"\\udfff\\ud800"', '"\\ud83d\\ude00"', '"ok"', '""', '"\\u0000"',
        '"' + "A" * 20_000 + '"', '"alice"', '"ALICE"', '"\\uff41lice"', '"globex"',
    ]
)  # fmt: skip


@st.composite
def json_values(draw: st.DrawFn, depth: int = 0) -> str:
    """JSON-ish text: mostly valid structure, with hostile leaves."""
    kind = draw(st.integers(0, 6 if depth < 4 else 2))
    if kind == 0:
        return draw(NUMBER_TOKENS)
    if kind == 1:
        return draw(STRING_TOKENS)
    if kind == 2:
        return draw(st.sampled_from(["true", "false", "null", "[]", "{}"]))
    if kind == 3:
        items = draw(st.lists(json_values(depth + 1), max_size=3))
        return "[" + ",".join(items) + "]"
    if kind == 4:
        keys = draw(
            st.lists(st.sampled_from(["a", "b", "tenant", "org_id", "user_id"]), max_size=3)
        )
        values = [draw(json_values(depth + 1)) for _ in keys]
        return "{" + ",".join(f'"{k}":{v}' for k, v in zip(keys, values, strict=True)) + "}"
    if kind == 5:
        n = draw(st.sampled_from([9, 64, 1000, 5000, 50_000]))
        return "[" * n + "]" * n
    return draw(st.text(max_size=20))  # raw text, lone surrogates included


@st.composite
def args_texts(draw: st.DrawFn, tool: str) -> str:
    """The arguments of one proposal: a plausible object for ``tool`` with one hostile
    field, or hostile text outright."""
    bases: dict[str, dict[str, Any]] = {
        "tickets.read": {"ticket_id": "T-1"},
        "tickets.create": {"title": "t", "requester_id": "alice"},
        "records.update": {"record_id": "REC-1"},
        "refunds.issue": {"order_id": "ORD-1", "amount_cents": 500, "currency": "EUR"},
        "deploys.trigger": {"service": "billing", "version": "1", "environment": "prod"},
        "users.delete": {"user_id": "U-1"},
    }
    base = bases.get(tool, {"ticket_id": "T-1"})
    shape = draw(st.integers(0, 4))
    plain = json.dumps(base)[:-1]
    if shape == 0:
        return json.dumps(base)  # well-formed: decided on its merits
    if shape == 1:  # one hostile field
        return plain + ', "fields": ' + draw(json_values()) + "}"
    if shape == 2:  # duplicate key
        name = next(iter(base))
        return plain + f', "{name}": ' + draw(json_values()) + "}"
    if shape == 3:  # a hostile value in place of an argument
        name = draw(st.sampled_from(sorted(base)))
        rest = {k: v for k, v in base.items() if k != name}
        head = json.dumps(rest)[:-1]
        sep = ", " if rest else ""
        return head + f'{sep}"{name}": ' + draw(json_values()) + "}"
    return draw(json_values())


# -- tokens --------------------------------------------------------------------------------

STRANGE_CLAIMS: st.SearchStrategy[Any] = st.sampled_from(
    [
        10**400, 1e308, -1e308, float("nan"), "", "\ud800", [], {}, ["admin"], None, True,
        "ACME", " alice ", "\uff41\uff4c\uff49\uff43\uff45", "x" * 10_000, 0, -1, 2**64,
    ]
)  # fmt: skip
TOKEN_KINDS = (
    "alice", "gina", "expired", "alg-none", "alg-none-strange", "hs256", "garbage-header",
    "tampered", "junk", "empty", "truncated",
)  # fmt: skip


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class TokenSpec:
    kind: str
    claim: str = "sub"
    value: Any = None


@st.composite
def token_specs(draw: st.DrawFn) -> TokenSpec:
    kind = draw(st.sampled_from(TOKEN_KINDS))
    if kind == "alg-none-strange":
        claim = draw(st.sampled_from(["sub", "tenant", "roles", "exp", "iat", "nbf", "aud"]))
        return TokenSpec(kind, claim, draw(STRANGE_CLAIMS))
    return TokenSpec(kind)


# -- envelopes -------------------------------------------------------------------------------

ID_KINDS = ("bound", "bound", "bound", "another-session", "collide", "free", "strange")
ROUTES = ("right", "right", "right", "other-tenant", "anywhere")


@dataclass(frozen=True)
class Case:
    """One hostile proposal, before a deployment gives it keys and ids."""

    token: TokenSpec
    tool: str
    args_json: str
    key: str | None
    id_kind: str
    route: str
    through_sdk: bool
    # When set: rita proposes a high-impact deploy and a session of this user id tries to
    # approve it (separation of duties under another spelling of the actor).
    approver: str | None = None
    # When set: a session from the trusted issuer with this tenant and these roles reads
    # each tenant's ticket and deletes a user; and, with ``approver``, approves under them.
    impostor: tuple[str, tuple[str, ...]] | None = None


@st.composite
def cases(draw: st.DrawFn) -> Case:
    tool = draw(st.sampled_from(TOOLS))
    key = draw(st.one_of(st.none(), st.sampled_from(SHARED_KEYS), st.text(max_size=8)))
    return Case(
        token=draw(token_specs()),
        tool=tool,
        args_json=draw(args_texts(tool)),
        key=key,
        id_kind=draw(st.sampled_from(ID_KINDS)),
        route=draw(st.sampled_from(ROUTES)),
        through_sdk=draw(st.booleans()),
        approver=draw(
            st.one_of(
                st.none(), st.none(), st.none(), st.none(), st.none(), st.none(),
                st.sampled_from(RITA_SPELLINGS), st.text(max_size=6),
            )
        ),
        impostor=draw(st.one_of(st.none(), st.none(), impostors())),
    )  # fmt: skip


@st.composite
def impostors(draw: st.DrawFn) -> tuple[str, tuple[str, ...]]:
    """A tenant and roles: mostly spellings of real ones, sometimes any Unicode text."""
    tenant = draw(st.one_of(st.sampled_from(TENANT_SPELLINGS), st.text(min_size=1, max_size=8)))
    role = st.one_of(st.sampled_from(ROLE_SPELLINGS), st.text(min_size=1, max_size=8))
    return tenant, tuple(draw(st.lists(role, max_size=3)))
