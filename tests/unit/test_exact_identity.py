"""Property: two sessions whose identifiers differ never get each other's resources, roles
or approvals (docs/contract.md, "Identity normalization"; ADR 0023).

Identifiers are drawn from all of Unicode and from spellings of one another (case, width,
padding, invisible code points, look-alikes from other scripts), signed by the trusted
development issuer. Every check that grants is exercised with the real verifier and the
real decider: tenant scope of reads, role membership, approver checks (tenant, roles,
separation of duties), identity arguments, approval bindings and key partitions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tests.attacks import build_proposal
from tests.harness import T0, Gate

from callgate.adapters.profiles import load_profile
from callgate.bootstrap import App, bootstrap
from callgate.decider.proposals import UnreadableRecord
from callgate.domain import events as ev
from callgate.domain.approvals import ApprovalBinding, check_approver, compare_binding
from callgate.domain.canonical import partition_key
from callgate.domain.catalog import ProfileError
from callgate.domain.codes import Code, Rejection
from callgate.domain.identity import SessionIssuer, SessionVerifier
from callgate.domain.identity_args import check_identity
from callgate.domain.keys import KeyRing
from callgate.domain.limits import parse_document
from callgate.domain.principal import Principal, fold_identity
from callgate.domain.scope import may_read
from callgate.providers.simulated import FaultPlan

RING = KeyRing.generate()
ISSUER = SessionIssuer(RING.session_signing_key, RING.session_kid)
VERIFIER = SessionVerifier(RING.session_verification_keys())
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

SEEDS = ("acme", "admin", "alice", "release-manager", "support", "globex")
VARIANTS = (
    str.upper,
    str.title,
    lambda s: s + " ",
    lambda s: " " + s,
    lambda s: "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in s),  # full width
    lambda s: s.replace("a", "\u0430").replace("e", "\u0435"),  # Cyrillic a, e
    lambda s: s[:1] + "\u200b" + s[1:],
    lambda s: s[:1] + "\u00ad" + s[1:],
    lambda s: "\ufeff" + s,
    lambda s: s.replace("i", "\u0456"),  # Cyrillic i
    lambda s: s.replace("K", "\u212a").replace("k", "\u212a"),  # Kelvin sign
    lambda s: s + "\u0301",  # a combining accent (NFC may compose it)
)


@st.composite
def identifiers(draw: st.DrawFn) -> str:
    """Any Unicode text, or a spelling of one of the seed identifiers."""
    if draw(st.booleans()):
        return draw(st.text(min_size=1, max_size=10))
    seed = draw(st.sampled_from(SEEDS))
    variant = draw(st.sampled_from((lambda s: s, *VARIANTS)))
    return str(variant(seed))


def principal(user: str, tenant: str, roles: list[str]) -> Principal | None:
    """The verified principal of a token the trusted issuer signs, or None when refused
    (a claim not canonical: always ``unauthenticated``)."""
    try:
        token = ISSUER.issue(user, tenant, roles, T0)
    except ValueError:
        return None
    try:
        p = VERIFIER.verify(token, T0)
    except Rejection as r:
        assert r.code is Code.UNAUTHENTICATED
        return None
    # Canonical claims are carried exactly as signed: nothing is rewritten.
    assert (p.user, p.tenant, list(p.roles)) == (user, tenant, list(dict.fromkeys(roles)))
    return p


sessions = st.tuples(identifiers(), identifiers(), st.lists(identifiers(), max_size=3))


@PROPERTY
@given(a=sessions, b=sessions)
def test_sessions_with_different_identifiers_never_share_a_grant(
    a: tuple[str, str, list[str]], b: tuple[str, str, list[str]]
) -> None:
    pa, pb = principal(*a), principal(*b)
    assume(pa is not None and pb is not None)
    assert pa is not None and pb is not None
    # Tenant scope of reads (status, pending, audit, HTTP, MCP, views).
    assert may_read(pb, pa.tenant) == (pb.tenant == pa.tenant or "callgate-operator" in pb.roles)
    # Roles: only an exact role is held.
    for role in pa.roles:
        assert pb.has_any_role((role,)) == (role in pb.roles)
    # Key partitions: another tenant's key is another partition.
    if pa.tenant != pb.tenant:
        assert partition_key(pa.tenant, "K", "i") != partition_key(pb.tenant, "K", "i")
    # Approval bindings: an approval for a's call does not cover b's.
    binding = ApprovalBinding(pa.tenant, pa.user, "t", "x", "v", "h", "d", "p", "i")
    other = ApprovalBinding(pb.tenant, pb.user, "t", "x", "v", "h", "d", "p", "i")
    differing = compare_binding(binding, other, ("tenant", "actor"))
    assert ("tenant" in differing) == (pa.tenant != pb.tenant)
    assert ("actor" in differing) == (pa.user != pb.user)
    # Identity arguments: b naming a's user is a spoof unless it is b's own exact user.
    try:
        check_identity(("requester_id",), ("tenant",), {"requester_id": pa.user}, pb)
        spoofed = False
    except Rejection as r:
        assert r.code is Code.IDENTITY_SPOOF
        spoofed = True
    assert spoofed == (pa.user != pb.user)
    # Approvals: b may approve a's call only as another person of a's exact tenant holding
    # the exact approver role, and never as a look-alike of a.
    approver_role = pa.roles[0] if pa.roles else "approver"
    try:
        check_approver("approver", pb, pa.user, pa.tenant, (approver_role,), True)
        approved = True
    except Rejection as r:
        assert r.code is Code.APPROVER_FORBIDDEN
        approved = False
    allowed = (
        pb.tenant == pa.tenant
        and approver_role in pb.roles
        and (pb.user == pa.user or fold_identity(pb.user) != fold_identity(pa.user))
    )
    assert approved == allowed


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    gate = Gate(tmp_path_factory.mktemp("exact"))
    yield bootstrap(gate.settings, clock=lambda: T0)


def _decide(app: App, token: str, tool: str, args: dict[str, str]) -> str:
    decider = app.decider()
    p = build_proposal(token, tool, json.dumps(args), T0)
    try:
        _, outs = decider.handle(decider.initial_state(), p, T0)
    except UnreadableRecord:
        return Code.INVALID_ARGUMENTS.value
    for o in outs:
        if isinstance(o, ev.ProposalRejected):
            return o.code
        if isinstance(o, ev.PolicyDecided) and o.decision == "deny":
            return Code.TOOL_FORBIDDEN.value
        if isinstance(o, ev.ExecutionRequested):
            return Code.EXECUTED.value
        if isinstance(o, ev.DryRunRequested):
            return Code.APPROVAL_REQUIRED.value
    return "undecided"


@PROPERTY
@given(tenant=identifiers(), roles=st.lists(identifiers(), max_size=3))
def test_the_decider_grants_acmes_resources_and_admins_tool_only_exactly(
    app: App, tenant: str, roles: list[str]
) -> None:
    """Through the decider: acme's ticket is read only by exactly acme with an exact caller
    role; users.delete reaches its approval only for exactly acme and exactly admin."""
    try:
        token = app.session_issuer.issue("ivan", tenant, roles, T0)
    except ValueError:
        return
    read = _decide(app, token, "tickets.read", {"ticket_id": "T-1"})
    delete = _decide(app, token, "users.delete", {"user_id": "U-1"})
    if read == Code.EXECUTED.value:
        assert tenant == "acme" and {"support", "admin"} & set(roles), (tenant, roles)
    if delete == Code.APPROVAL_REQUIRED.value:
        assert tenant == "acme" and "admin" in roles, (tenant, roles)
    assert read in {c.value for c in Code} and delete in {c.value for c in Code}, (read, delete)


def test_the_seed_spellings_are_each_refused() -> None:
    """The spellings of issue 25, each: not acme's reader, not admin."""
    for tenant in ("ACME", "Acme", "\uff41\uff43\uff4d\uff45"):
        p = principal("ivan", tenant, ["support"])
        assert p is not None and not may_read(p, "acme")
    for role in ("ADMIN", "Admin"):
        p = principal("ivan", "acme", [role])
        assert p is not None and not p.has_any_role(("admin",))
    assert principal("ivan", "acme ", ["support"]) is None
    assert principal("ivan", "acme", [" admin"]) is None


# --- the strict reader also reads configuration -----------------------------------------------


def test_a_profile_with_a_duplicate_key_does_not_load(tmp_path: Path) -> None:
    profile = tmp_path / "profile.yaml"
    profile.write_text("version: 1\nversion: 2\ntools: {}\n", encoding="utf-8")
    with pytest.raises(ProfileError, match="duplicate key 'version'"):
        load_profile(profile)


@pytest.mark.parametrize(
    "text", ['{"a": {}, "a": {}}', '{"a": {}, "\\u0061": {}}', '{"a": NaN}', '{"a": "\\ud800"}']
)
def test_json_in_settings_and_fault_plans_is_read_strictly(text: str) -> None:
    with pytest.raises(ValueError):
        FaultPlan.from_env({"CALLGATE_FAULTS": text})
    with pytest.raises(ValueError):
        parse_document(text)
