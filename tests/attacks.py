"""A fixed corpus of named attacks on callgate (hostile input), reusable by every backend.

Each ``AttackCase`` says what an attacker tries, how to build the hostile request(s)
against a ``Surface`` (the in-memory ``Gate`` or the SDK over the embedded store), and
the code the contract promises. ``run_case`` proves, for any backend:

1. the attack gets its documented code (docs/contract.md "Vocabulary", and the
   reason or binding it names);
2. nothing executes: the provider ledger is unchanged and the attacking invocation has
   no ``ExecutionRequested`` (C1, C12);
3. the decider stays up: a legitimate call made afterwards is still decided.

``arrange`` does the legitimate set-up (its effects are the baseline); ``act`` is the
attack. ``wire`` cases arrive as bytes and must be dead-lettered with their reason and
original bytes (``malformed_event``, the first check of the order of checks).
"""

from __future__ import annotations

import base64
import json
import random
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization

from callgate.adapters.avro_codec import MARKER, AvroCodec
from callgate.application.ports import Ports as Wired
from callgate.application.routing import route as sdk_route
from callgate.domain import events as ev
from callgate.domain.canonical import args_hash, partition_key
from callgate.domain.codes import Code
from callgate.domain.identity import AUDIENCE, DEV_ISSUER, SessionIssuer
from callgate.domain.keys import KeyRing
from callgate.domain.scope import OPERATOR_ROLE, bound_id
from callgate.surfaces.sdk import Gateway

DAY_S = 86_400
SETTLE_S = 10.0  # how long a call through the SDK may take to settle
Args = dict[str, Any]
Ctx = dict[str, str]

REFUND: Args = {"order_id": "ORD-1", "amount_cents": 500, "currency": "USD"}
TICKET: Args = {"title": "Printer on fire", "requester_id": "alice"}
DEPLOY: Args = {"service": "billing", "version": "2.0.0", "environment": "production"}
READ_T1: Args = {"ticket_id": "T-1"}
# Look-alikes, escaped so that a reader sees what they are.
CYRILLIC_ALICE = "\u0430lice"  # Cyrillic a (U+0430), then "lice": not alice
FULLWIDTH_ALICE = "\uff21\uff2c\uff29\uff23\uff25"  # "ALICE" in full-width capitals
FULLWIDTH_ORG_ID = "\uff4f\uff52\uff47\uff3f\uff49\uff44"  # "org_id" in full-width
CYRILLIC_TOOL = "tickets.re\u0430d"  # "tickets.read" with a Cyrillic a
# Other spellings of the tenant acme and the role admin (issue 25): each is another
# identifier (exact to grant); padded ones are not canonical (unauthenticated).
TENANT_SPELLINGS: dict[str, Code] = {
    "ACME": Code.TOOL_FORBIDDEN,
    "Acme": Code.TOOL_FORBIDDEN,
    "acme ": Code.UNAUTHENTICATED,
    "\uff41\uff43\uff4d\uff45": Code.TOOL_FORBIDDEN,  # full-width acme
}
ROLE_SPELLINGS: dict[str, Code] = {
    "ADMIN": Code.TOOL_FORBIDDEN,
    "Admin": Code.TOOL_FORBIDDEN,
    " admin": Code.UNAUTHENTICATED,
}
# Look-alikes of rita: another identifier, but one that reads as rita.
RITA_LOOK_ALIKES = ("Rita", "\uff52\uff49\uff54\uff41", "r\u0456ta")  # full width, Cyrillic i


@dataclass(frozen=True)
class Verdict:
    """What a backend answered to one attack: the code, and what it said about it."""

    invocation_id: str
    code: str
    message: str = ""
    details: Mapping[str, str] = field(default_factory=dict)
    original: bytes | None = None  # dead-letters only: the bytes that were refused


class Surface(ABC):
    """The Gate-like API an attack is written against: one subclass per backend.

    What is the same on every backend lives here: development sessions, and ``propose``
    as a client sends it (through the backend's SDK ``Gateway`` where the surface has one,
    else built by ``build_proposal``, which routes as the SDK does, and ``submit``-ted).
    """

    def __init__(self, app: Wired, clock: Callable[[], int]) -> None:
        self.app = app
        self._clock = clock

    @property
    def now_ms(self) -> int:
        return self._clock()

    def sdk(self) -> Gateway | None:
        """The SDK client that ``propose`` goes through, if this backend has one."""
        return None

    def session(
        self,
        user: str,
        tenant: str = "acme",
        roles: tuple[str, ...] = ("support",),
        ttl: int = DAY_S,
    ) -> str:
        return self.app.session_issuer.issue(user, tenant, list(roles), self.now_ms, ttl)

    def propose(
        self,
        token: str,
        tool: str,
        args: Mapping[str, Any] | str,
        key: str | None = None,
        approval_id: str | None = None,
    ) -> Verdict:
        """Publish a proposal the way a client (the SDK) routes it; wait until it settles."""
        sdk = self.sdk()
        if sdk is None:
            return self.submit(build_proposal(token, tool, args, self.now_ms, key, approval_id))
        answer = sdk.propose(token, tool, args, key, approval_id, timeout_s=SETTLE_S)
        if answer["invocation_id"] is None:  # refused at the entry: nothing published
            error = answer["error"]
            assert error["code"] == answer["outcome"], answer
            return Verdict("", error["code"], error["message"], error.get("details", {}))
        inv = str(answer["invocation_id"])
        return verdict_from_status(inv, sdk.status(inv, self.operator()))

    def operator(self) -> str:
        """A session that may read every tenant (``callgate-operator``)."""
        return self.session("operator", "ops", (OPERATOR_ROLE,))

    @abstractmethod
    def submit(self, proposal: ev.ToolCallProposed, times: int = 1) -> Verdict:
        """Publish ``proposal`` exactly as given, ``times`` times; wait until it settles."""

    @abstractmethod
    def decide(self, token: str, invocation_id: str, decision: str = "grant") -> Verdict:
        """Submit an approval decision; code ``granted`` (details: approval_id), ``denied``
        or the refusal's code."""

    @abstractmethod
    def advance(self, ms: int) -> None:
        """Move the clock and let due timers fire."""

    @abstractmethod
    def publish_raw(self, topic: str, partition_key: str, payload: bytes) -> Verdict:
        """Append bytes as they came; the verdict of the dead-letter they must produce."""

    @abstractmethod
    def events_of(self, invocation_id: str) -> list[ev.Event]:
        """The events of one invocation, in log order."""

    @abstractmethod
    def effects(self) -> list[dict[str, Any]]:
        """The provider ledger."""


# --- building hostile requests ------------------------------------------------------------


def build_proposal(
    token: str,
    tool: str,
    args: Mapping[str, Any] | str,
    now_ms: int,
    key: str | None = None,
    approval_id: str | None = None,
    invocation_id: str | None = None,
) -> ev.ToolCallProposed:
    """A proposal routed as the SDK routes it (by tenant + key, else by approval, else by id).

    Every backend's surface builds its requests here or in the SDK itself, so a
    disagreement between the SDK's routing and the decider's shows up as a failure.
    """
    inv = invocation_id or bound_id(token, f"inv-{uuid.uuid4()}")  # as the SDK binds it
    return ev.ToolCallProposed(
        event_id=f"evt-{inv}",
        invocation_id=inv,
        partition_key=sdk_route(token, key, approval_id, inv),  # exactly as the SDK routes
        correlation_id=inv,
        occurred_at=now_ms,
        producer="attacker",
        session_token=token,
        tool=tool,
        args_json=args if isinstance(args, str) else json.dumps(args),
        idempotency_key=key,
        approval_id=approval_id,
    )


def session_claims(now_ms: int, user: str = "alice", roles: tuple[str, ...] = ("admin",)) -> Args:
    """Claims shaped exactly like the development issuer's, valid at ``now_ms``."""
    iat = now_ms // 1000
    return {
        "sub": user,
        "tenant": "acme",
        "roles": list(roles),
        "iat": iat,
        "nbf": iat,
        "exp": iat + DAY_S,
        "iss": DEV_ISSUER,
        "aud": AUDIENCE,
        "sid": "s-attacker",
    }


def forged_token(app: Wired, now_ms: int) -> str:
    """Signed with a key of another deployment, under this deployment's own kid."""
    other = KeyRing.generate().session_signing_key
    issuer = SessionIssuer(other, app.keys.session_kid)
    return issuer.issue("alice", "acme", ["admin"], now_ms)


def wrong_audience_token(app: Wired, now_ms: int) -> str:
    keys = app.keys
    issuer = SessionIssuer(keys.session_signing_key, keys.session_kid, audience="billing-api")
    return issuer.issue("alice", "acme", ["admin"], now_ms)


def alg_none_token(app: Wired, now_ms: int) -> str:
    kid = app.keys.session_kid
    # "" is pyjwt's spelling of "no key" for alg none
    return jwt.encode(session_claims(now_ms), "", algorithm="none", headers={"kid": kid})


def hs256_token(app: Wired, now_ms: int) -> str:
    """Algorithm confusion: HMAC keyed with the issuer's *public* key (which anyone has)."""
    public = app.keys.session_signing_key.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    kid = app.keys.session_kid
    return jwt.encode(session_claims(now_ms), public, algorithm="HS256", headers={"kid": kid})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def tamper_payload(token: str, **changes: Any) -> str:
    """Edit a JWS payload and keep the original header and signature."""
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims.update(changes)
    return f"{header}.{_b64(json.dumps(claims).encode())}.{signature}"


def approve(s: Surface, token: str, invocation_id: str) -> str:
    verdict = s.decide(token, invocation_id)
    assert verdict.code == "granted", verdict
    return verdict.details["approval_id"]


def settled(s: Surface, verdict: Verdict, code: str) -> str:
    """Set-up step that must succeed as planned; returns its invocation id."""
    assert verdict.code == code, verdict
    return verdict.invocation_id


# --- the corpus ------------------------------------------------------------------------------


Arrange = Callable[[Surface], Ctx]
Act = Callable[[Surface, Ctx], Verdict]
Check = Callable[[Surface, Ctx, Verdict], None]


def nothing(s: Surface) -> Ctx:
    return {}


@dataclass(frozen=True)
class AttackCase:
    """One named attack: the hostile request(s) and the code the contract promises."""

    name: str
    description: str  # what the attacker tries and the clause that stops it
    expected: Code
    act: Act
    arrange: Arrange = nothing
    reason: str = ""  # a fragment the rejection message (or dead-letter reason) must hold
    # detail -> a value that must be one of the detail's comma-separated items
    details: Mapping[str, str] = field(default_factory=dict)
    check: Check | None = None  # further assertions about the log
    wire: bool = False  # arrives as bytes: must be dead-lettered
    needs_topics: bool = False  # refused by topic admission, which only durable runners have


# -- sessions (C6: identity comes from a verified session) --


def _alice_creates(s: Surface, token: str) -> Verdict:
    return s.propose(token, "tickets.create", TICKET)


def _expired_token(s: Surface) -> Ctx:
    return {"token": s.session("alice", roles=("admin",), ttl=60)}


def _act_expired_token(s: Surface, ctx: Ctx) -> Verdict:
    s.advance(60_000)  # exp is exclusive: a token is dead at its exp instant
    return _alice_creates(s, ctx["token"])


def _foreign_resource(s: Surface, ctx: Ctx) -> Verdict:
    gina = s.session("gina", "globex", ("support",))
    # the tenant field names gina's own tenant (so C6 passes); the record is acme's
    return s.propose(gina, "records.update", {"record_id": "REC-1", "fields": {"tenant": "globex"}})


# -- arguments (C7: validated before the ACL) --


def _oversized(s: Surface, ctx: Ctx) -> Verdict:
    limit = s.app.profile.entry_limits.max_args_bytes
    return s.propose(s.session("alice"), "tickets.create", {**TICKET, "body": "A" * limit})


def _deep(s: Surface, ctx: Ctx) -> Verdict:
    nested: Any = "leaf"
    for _ in range(s.app.profile.entry_limits.max_depth):  # with the top level: max_depth + 1
        nested = {"n": nested}
    return s.propose(s.session("alice"), "records.update", {"record_id": "REC-1", "fields": nested})


def _parser_bomb(s: Surface, ctx: Ctx) -> Verdict:
    # within the size limit, but deep enough to exhaust a recursive JSON parser
    text = '{"record_id": "REC-1", "fields": ' + "[" * 5000 + "]" * 5000 + "}"
    assert len(text) < s.app.profile.entry_limits.max_args_bytes
    return s.propose(s.session("alice"), "records.update", text)


def _duplicate_keys(s: Surface, ctx: Ctx) -> Verdict:
    # two parsers could read different tickets from one text: refuse the text
    return s.propose(s.session("alice"), "tickets.read", '{"ticket_id":"T-1","ticket_id":"GT-1"}')


# -- identity in arguments (C6) --


def _nested_tenant(s: Surface, ctx: Ctx) -> Verdict:
    fields = {"acl": [{"role": "owner"}, {"tenant_id": "globex"}]}
    return s.propose(s.session("alice"), "records.update", {"record_id": "REC-1", "fields": fields})


def _fullwidth_tenant_key(s: Surface, ctx: Ctx) -> Verdict:
    fields = {"meta": {FULLWIDTH_ORG_ID: "globex"}}  # NFKC folds it to org_id
    return s.propose(s.session("alice"), "records.update", {"record_id": "REC-1", "fields": fields})


def _cyrillic_user(s: Surface, ctx: Ctx) -> Verdict:
    return s.propose(
        s.session("alice"), "tickets.create", {**TICKET, "requester_id": CYRILLIC_ALICE}
    )


def _fullwidth_user(s: Surface, ctx: Ctx) -> Verdict:
    return s.propose(s.session("alice"), "refunds.issue", {**REFUND, "issued_by": FULLWIDTH_ALICE})


# -- approvals (C4, C11) --


def _pending_refund(s: Surface, key: str = "K", user: str = "alice") -> Ctx:
    token = s.session(user)
    inv = settled(s, s.propose(token, "refunds.issue", REFUND, key=key), "approval_required")
    return {"token": token, "inv": inv, "approval": approve(s, token, inv)}


def _act_tampered(s: Surface, ctx: Ctx) -> Verdict:
    bigger = {**REFUND, "amount_cents": 9000}
    forged = tamper_payload(ctx["approval"], args_hash=args_hash(bigger))
    return s.propose(ctx["token"], "refunds.issue", bigger, key="K", approval_id=forged)


def _act_expired_approval(s: Surface, ctx: Ctx) -> Verdict:
    spec = s.app.profile.tool("refunds.issue")
    assert spec is not None
    s.advance(spec.approval_ttl_seconds * 1000 + 1)
    return s.propose(ctx["token"], "refunds.issue", REFUND, key="K", approval_id=ctx["approval"])


def _used_refund(s: Surface) -> Ctx:
    ctx = _pending_refund(s, key="K1")
    v = s.propose(ctx["token"], "refunds.issue", REFUND, key="K1", approval_id=ctx["approval"])
    settled(s, v, "executed")
    return ctx


def _act_replay_other_key(s: Surface, ctx: Ctx) -> Verdict:
    return s.propose(ctx["token"], "refunds.issue", REFUND, key="K2", approval_id=ctx["approval"])


def _act_replay_other_invocation(s: Surface, ctx: Ctx) -> Verdict:
    return s.propose(ctx["token"], "refunds.issue", REFUND, approval_id=ctx["approval"])


def _bobs_approval(s: Surface) -> Ctx:
    return _pending_refund(s, key="KB", user="bob")


def _act_alice_presents_bobs(s: Surface, ctx: Ctx) -> Verdict:
    alice = s.session("alice")
    return s.propose(alice, "refunds.issue", REFUND, key="KB", approval_id=ctx["approval"])


def _act_other_arguments(s: Surface, ctx: Ctx) -> Verdict:
    # no key: routed to the approval's partition, where it is checked against this call
    other = {**REFUND, "amount_cents": 9000}
    return s.propose(ctx["token"], "refunds.issue", other, approval_id=ctx["approval"])


def _self_approval_pending(s: Surface) -> Ctx:
    rita = s.session("rita", roles=("release", "release-manager"))
    inv = settled(s, s.propose(rita, "deploys.trigger", DEPLOY, key="KD"), "approval_required")
    return {"token": rita, "inv": inv}


def _act_self_approval(s: Surface, ctx: Ctx) -> Verdict:
    return s.decide(ctx["token"], ctx["inv"])


def _still_pending(s: Surface, ctx: Ctx, v: Verdict) -> None:
    assert not [e for e in s.events_of(ctx["inv"]) if isinstance(e, ev.ApprovalGranted)]


def _tenant_spelling_reads(tenant: str) -> Act:
    def act(s: Surface, ctx: Ctx) -> Verdict:
        return s.propose(s.session("alice", tenant, ("support",)), "tickets.read", READ_T1)

    return act


def _role_spelling_deletes(role: str) -> Act:
    def act(s: Surface, ctx: Ctx) -> Verdict:
        return s.propose(s.session("adam", "acme", (role,)), "users.delete", {"user_id": "U-1"})

    return act


def _look_alike_approves(user: str) -> Act:
    def act(s: Surface, ctx: Ctx) -> Verdict:
        return s.decide(s.session(user, roles=("release", "release-manager")), ctx["inv"])

    return act


def _spelling_cases() -> list[AttackCase]:
    cases = [
        AttackCase(
            f"tenant-spelled-{tenant.strip()}{'-padded' if tenant != tenant.strip() else ''}",
            f"C6: a session of tenant {tenant!r} reads acme's ticket (exact to grant)",
            code,
            _tenant_spelling_reads(tenant),
            reason="claim 'tenant'" if code is Code.UNAUTHENTICATED else "",
        )
        for tenant, code in TENANT_SPELLINGS.items()
    ]
    cases += [
        AttackCase(
            f"role-spelled-{role.strip()}{'-padded' if role != role.strip() else ''}",
            f"C7: a session with role {role!r} deletes a user (admin only; exact to grant)",
            code,
            _role_spelling_deletes(role),
            reason="claim 'roles'" if code is Code.UNAUTHENTICATED else "",
        )
        for role, code in ROLE_SPELLINGS.items()
    ]
    cases += [
        AttackCase(
            f"look-alike-approver-{i}",
            f"C4: {user!r}, a look-alike of the actor rita, approves rita's deploy",
            Code.APPROVER_FORBIDDEN,
            _look_alike_approves(user),
            _self_approval_pending,
            reason="look-alike",
            check=_still_pending,
        )
        for i, user in enumerate(RITA_LOOK_ALIKES)
    ]
    return cases


# -- idempotency (C8) --


def _read_with_key(s: Surface) -> Ctx:
    alice = s.session("alice")
    return {"inv": settled(s, s.propose(alice, "tickets.read", READ_T1, key="K"), "executed")}


def _act_key_other_actor(s: Surface, ctx: Ctx) -> Verdict:
    return s.propose(s.session("amy"), "tickets.read", READ_T1, key="K")


def _act_key_other_tool(s: Surface, ctx: Ctx) -> Verdict:
    return s.propose(s.session("alice"), "tickets.create", TICKET, key="K")


def _act_key_other_target(s: Surface, ctx: Ctx) -> Verdict:
    return s.propose(s.session("alice"), "tickets.read", {"ticket_id": "T-2"}, key="K")


def _names_original(s: Surface, ctx: Ctx, v: Verdict) -> None:
    assert v.details["original_invocation_id"] == ctx["inv"]


def _ticket_with_key(s: Surface) -> Ctx:
    alice = s.session("alice")
    return {"inv": settled(s, s.propose(alice, "tickets.create", TICKET, key="K"), "executed")}


def _act_key_other_tenant(s: Surface, ctx: Ctx) -> Verdict:
    gina = s.session("gina", "globex", ("support",))
    refund = {**REFUND, "order_id": "GORD-1"}
    return s.propose(gina, "refunds.issue", refund, key="K")


def _decided_on_its_own(s: Surface, ctx: Ctx, v: Verdict) -> None:
    mine = s.events_of(v.invocation_id)
    assert not [e for e in mine if isinstance(e, ev.ReplayServed | ev.ProposalRejected)]
    (decided,) = [e for e in mine if isinstance(e, ev.PolicyDecided)]
    assert (decided.tenant, decided.decision) == ("globex", "permit")
    original = s.events_of(ctx["inv"])[0]
    assert decided.partition_key != original.partition_key  # other tenant, other partition


# -- routing and delivery (docs/contract.md "Shape") --


def _globex_ticket(s: Surface) -> Ctx:
    gina = s.session("gina", "globex", ("support",))
    ticket = {**TICKET, "requester_id": "gina"}
    return {"inv": settled(s, s.propose(gina, "tickets.create", ticket, key="K"), "executed")}


def _act_misrouted(s: Surface, ctx: Ctx) -> Verdict:
    # alice aims her key K at globex's partition, hoping for gina's stored result
    p = build_proposal(s.session("alice"), "tickets.create", TICKET, s.now_ms, key="K")
    return s.submit(replace(p, partition_key=partition_key("globex", "K", p.invocation_id)))


def _no_replay(s: Surface, ctx: Ctx, v: Verdict) -> None:
    assert not [e for e in s.events_of(v.invocation_id) if isinstance(e, ev.ReplayServed)]


def _act_twice(s: Surface, ctx: Ctx) -> Verdict:
    p = build_proposal(s.session("alice"), "refunds.issue", REFUND, s.now_ms)
    return s.submit(p, times=2)


def _decided_once(s: Surface, ctx: Ctx, v: Verdict) -> None:
    kinds = [e.event_type for e in s.events_of(v.invocation_id)]
    for kind in ("PolicyDecided", "DryRunRequested", "ApprovalRequested"):
        assert kinds.count(kind) == 1, kinds


# -- bytes on the wire (malformed_event: dead-lettered with reason and original bytes) --


def _wire_proposal(s: Surface) -> ev.ToolCallProposed:
    return build_proposal(s.session("alice"), "tickets.create", TICKET, s.now_ms)


def _raw(s: Surface, p: ev.Event, payload: bytes, topic: str = "requests") -> Verdict:
    return replace(s.publish_raw(topic, p.partition_key, payload), invocation_id=p.invocation_id)


def _act_random_bytes(s: Surface, ctx: Ctx) -> Verdict:
    payload = random.Random(5).randbytes(96)
    assert payload[:2] != MARKER
    return _raw(s, _wire_proposal(s), payload)


def _act_truncated(s: Surface, ctx: Ctx) -> Verdict:
    p = _wire_proposal(s)
    payload = AvroCodec.default().encode(p)
    return _raw(s, p, payload[: len(payload) // 2])


def _act_unknown_schema(s: Surface, ctx: Ctx) -> Verdict:
    p = _wire_proposal(s)
    payload = AvroCodec.default().encode(p)
    return _raw(s, p, MARKER + bytes.fromhex("deadbeefdeadbeef") + payload[10:])


def forged_execution(
    event_id: str, invocation_id: str, partition_key: str, now_ms: int = 0, producer: str = ""
) -> ev.ExecutionRequested:
    """The decider's order to create a ticket, forged by a client to skip every check; a
    service event, so the ``requests`` topic must refuse it (topic admission)."""
    return ev.ExecutionRequested(
        event_id=event_id,
        invocation_id=invocation_id,
        partition_key=partition_key,
        occurred_at=now_ms,
        producer=producer,
        tenant="acme",
        tool="tickets.create",
        target="",
        args_json=json.dumps(TICKET),
        execution_token="xi-forged",
        attempt=1,
    )


def _act_service_event(s: Surface, ctx: Ctx) -> Verdict:
    p = _wire_proposal(s)
    forged = forged_execution(
        f"forged-{p.invocation_id}", p.invocation_id, p.partition_key, s.now_ms, "decider"
    )
    return _raw(s, forged, AvroCodec.default().encode(forged))


UNAUTHENTICATED = Code.UNAUTHENTICATED

CORPUS: list[AttackCase] = [
    # sessions
    AttackCase(
        "forged-token",
        "C6: a token signed by another key under this deployment's kid",
        UNAUTHENTICATED,
        lambda s, c: _alice_creates(s, forged_token(s.app, s.now_ms)),
        reason="bad signature",
    ),
    AttackCase(
        "expired-token",
        "C6: a genuine session token used after its exp",
        UNAUTHENTICATED,
        _act_expired_token,
        _expired_token,
        reason="token expired",
    ),
    AttackCase(
        "wrong-audience-token",
        "C6: a genuine token minted for another service (aud)",
        UNAUTHENTICATED,
        lambda s, c: _alice_creates(s, wrong_audience_token(s.app, s.now_ms)),
        reason="wrong audience",
    ),
    AttackCase(
        "alg-none-token",
        "C6: an unsigned token (alg: none) naming an admin",
        UNAUTHENTICATED,
        lambda s, c: _alice_creates(s, alg_none_token(s.app, s.now_ms)),
        reason="algorithm 'none' not accepted",
    ),
    AttackCase(
        "hs256-token",
        "C6: algorithm confusion, HS256 keyed with the issuer's public key",
        UNAUTHENTICATED,
        lambda s, c: _alice_creates(s, hs256_token(s.app, s.now_ms)),
        reason="algorithm 'HS256' not accepted",
    ),
    AttackCase(
        "other-tenant-token-on-this-tenants-resource",
        "C7: a globex session updates an acme record, claiming it for globex",
        Code.TOOL_FORBIDDEN,
        _foreign_resource,
    ),
    # tools and arguments
    AttackCase(
        "unknown-tool-confusable",
        "C10: tickets.read spelled with a Cyrillic a is not a catalog tool",
        Code.UNKNOWN_TOOL,
        lambda s, c: s.propose(s.session("alice"), CYRILLIC_TOOL, READ_T1),
    ),
    AttackCase(
        "oversized-arguments",
        "C7: arguments over entry_limits.max_args_bytes",
        Code.INVALID_ARGUMENTS,
        _oversized,
        reason="entry_limits.max_args_bytes",
    ),
    AttackCase(
        "deep-nesting",
        "C7: arguments nested one level deeper than entry_limits.max_depth",
        Code.INVALID_ARGUMENTS,
        _deep,
        reason="entry_limits.max_depth",
    ),
    AttackCase(
        "parser-bomb-nesting",
        "C7: 5000 nested arrays within the size limit",
        Code.INVALID_ARGUMENTS,
        _parser_bomb,
        reason="entry_limits.max_depth",
    ),
    AttackCase(
        "duplicate-json-keys",
        "C7: one text, two readings (ticket T-1 or GT-1)",
        Code.INVALID_ARGUMENTS,
        _duplicate_keys,
        reason="duplicate key",
    ),
    # identity in arguments
    AttackCase(
        "tenant-nested-in-a-list",
        "C6: a tenant field deep inside free-form fields",
        Code.IDENTITY_SPOOF,
        _nested_tenant,
        details={"field": "fields.acl.1.tenant_id"},
    ),
    AttackCase(
        "tenant-key-in-full-width",
        "C6: a tenant field whose key is spelled in full-width letters",
        Code.IDENTITY_SPOOF,
        _fullwidth_tenant_key,
        details={"field": "fields.meta." + FULLWIDTH_ORG_ID},
    ),
    AttackCase(
        "cyrillic-look-alike-user",
        "C6: requester_id alice spelled with a Cyrillic a (U+0430) is not alice",
        Code.IDENTITY_SPOOF,
        _cyrillic_user,
        details={"field": "requester_id"},
    ),
    AttackCase(
        "full-width-upper-case-user-is-a-spoof",
        "C6: ALICE in full-width capitals is another identifier than alice (exact to grant)",
        Code.IDENTITY_SPOOF,
        _fullwidth_user,
        details={"field": "issued_by"},
    ),
    # approvals
    AttackCase(
        "tampered-approval",
        "C11: approval payload edited to a bigger amount, signature kept",
        Code.APPROVAL_MISSING,
        _act_tampered,
        lambda s: _pending_refund(s),
        reason="bad signature",
    ),
    AttackCase(
        "junk-approval-id",
        "C11: a string that is no artifact at all, presented without a key",
        Code.APPROVAL_MISSING,
        lambda s, c: s.propose(s.session("alice"), "refunds.issue", REFUND, approval_id="junk"),
        reason="malformed token",
    ),
    AttackCase(
        "expired-approval",
        "C11: a genuine approval presented after its ttl",
        Code.APPROVAL_EXPIRED,
        _act_expired_approval,
        lambda s: _pending_refund(s),
    ),
    AttackCase(
        "approval-replayed-under-another-key",
        "C11: an approval that authorized key K1's call, replayed under key K2",
        Code.APPROVAL_CONSUMED,
        _act_replay_other_key,
        _used_refund,
    ),
    AttackCase(
        "approval-replayed-by-another-invocation",
        "C11: an approval that authorized key K1's call, replayed without a key",
        Code.APPROVAL_CONSUMED,
        _act_replay_other_invocation,
        _used_refund,
    ),
    AttackCase(
        "approval-of-another-actor",
        "C4, C11: alice presents bob's approval for the very same arguments",
        Code.APPROVAL_MISMATCH,
        _act_alice_presents_bobs,
        _bobs_approval,
        details={"bindings": "actor"},
    ),
    AttackCase(
        "approval-for-other-arguments",
        "C11: an approval for one refund presented for a bigger one",
        Code.APPROVAL_MISMATCH,
        _act_other_arguments,
        lambda s: _pending_refund(s),
        details={"bindings": "args_hash"},
    ),
    AttackCase(
        "self-approval-of-approver-tool",
        "C4: the actor approves their own high-impact deploy",
        Code.APPROVER_FORBIDDEN,
        _act_self_approval,
        _self_approval_pending,
        check=_still_pending,
    ),
    # idempotency
    AttackCase(
        "key-reused-by-another-actor",
        "C8: amy reuses alice's key for the same read",
        Code.IDEMPOTENCY_CONFLICT,
        _act_key_other_actor,
        _read_with_key,
        details={"differs": "actor"},
        check=_names_original,
    ),
    AttackCase(
        "key-reused-for-another-tool",
        "C8: alice reuses her read's key for a mutation",
        Code.IDEMPOTENCY_CONFLICT,
        _act_key_other_tool,
        _read_with_key,
        details={"differs": "tool"},
        check=_names_original,
    ),
    AttackCase(
        "key-reused-for-another-target",
        "C8: alice reuses her read's key on another ticket",
        Code.IDEMPOTENCY_CONFLICT,
        _act_key_other_target,
        _read_with_key,
        details={"differs": "target"},
        check=_names_original,
    ),
    AttackCase(
        "key-reused-by-another-tenant",
        "C8: the same key in another tenant is another partition: decided on its own merits",
        Code.APPROVAL_REQUIRED,
        _act_key_other_tenant,
        _ticket_with_key,
        check=_decided_on_its_own,
    ),
    # routing and delivery
    AttackCase(
        "misrouted-partition-key",
        "Shape: a proposal placed on another tenant's key partition",
        Code.MALFORMED_EVENT,
        _act_misrouted,
        _globex_ticket,
        reason="misrouted",
        check=_no_replay,
    ),
    AttackCase(
        "proposal-delivered-twice",
        "Shape: at-least-once delivery; one proposal gets exactly one decision",
        Code.APPROVAL_REQUIRED,
        _act_twice,
        check=_decided_once,
    ),
    # bytes
    AttackCase(
        "random-bytes",
        "malformed_event: bytes that are not Avro single-object encoding",
        Code.MALFORMED_EVENT,
        _act_random_bytes,
        reason="marker",
        wire=True,
    ),
    AttackCase(
        "truncated-avro",
        "malformed_event: a valid proposal cut in half",
        Code.MALFORMED_EVENT,
        _act_truncated,
        reason="corrupt ToolCallProposed",
        wire=True,
    ),
    AttackCase(
        "unknown-schema-fingerprint",
        "malformed_event: a body under a schema fingerprint nobody registered",
        Code.MALFORMED_EVENT,
        _act_unknown_schema,
        reason="unknown schema fingerprint deadbeefdeadbeef",
        wire=True,
    ),
    AttackCase(
        "service-event-on-requests-topic",
        "malformed_event: a client writes ExecutionRequested to the requests topic",
        Code.MALFORMED_EVENT,
        _act_service_event,
        reason="ExecutionRequested does not belong on topic requests",
        wire=True,
        needs_topics=True,
    ),
]

CORPUS += _spelling_cases()
BY_NAME: dict[str, AttackCase] = {c.name: c for c in CORPUS}
assert len(BY_NAME) == len(CORPUS), "attack names must be unique"


# --- running a case ----------------------------------------------------------------------


def assert_verdict(case: AttackCase, v: Verdict) -> None:
    assert v.code == case.expected.value, f"{case.name}: {v}"
    assert case.reason in v.message, f"{case.name}: {v.message!r} lacks {case.reason!r}"
    for name, item in case.details.items():
        assert item in v.details.get(name, "").split(","), f"{case.name}: {v.details}"


def run_case(s: Surface, case: AttackCase) -> Verdict:
    """Arrange, attack, and prove: the code, no execution, and the decider still up."""
    ctx = case.arrange(s)
    before = s.effects()
    v = case.act(s, ctx)
    assert_verdict(case, v)
    if case.wire:
        assert v.original is not None and v.message, f"{case.name}: dead-letter without bytes"
    assert s.effects() == before, f"{case.name}: the provider ledger changed"
    ran = [e for e in s.events_of(v.invocation_id) if isinstance(e, ev.ExecutionRequested)]
    assert ran == [], f"{case.name}: {v.invocation_id} was sent to a provider"
    if case.check is not None:
        case.check(s, ctx, v)
    # the decider stays up: a legitimate call is still decided
    alive = s.propose(s.session("alice"), "tickets.read", READ_T1)
    assert alive.code == Code.EXECUTED.value, f"{case.name}: {alive}"
    return v


def verdict_from_status(invocation_id: str, status: Mapping[str, Any] | None) -> Verdict:
    """The verdict the status view gives; a rejection's error code must equal the outcome."""
    assert status is not None, f"no status for {invocation_id}"
    assert status["settled"], f"{invocation_id} did not settle: {status}"
    error = status.get("error") or {}
    if error:
        assert error["code"] == status["outcome"], status
    return Verdict(
        invocation_id,
        str(status["outcome"]),
        str(error.get("message", "")),
        {str(k): str(v) for k, v in (error.get("details") or {}).items()},
    )


def verdict_from_decision(invocation_id: str, answer: Mapping[str, Any]) -> Verdict:
    """The verdict of an approval decision from the ``decisions`` view record."""
    if answer["decision"] == "granted":
        return Verdict(invocation_id, "granted", details={"approval_id": answer["approval_id"]})
    if answer["decision"] == "rejected":
        return Verdict(invocation_id, answer["error"]["code"], answer["error"]["message"])
    return Verdict(invocation_id, str(answer["decision"]))


def verdict_from_dead_letter(dead: ev.EventDeadLettered) -> Verdict:
    return Verdict(
        dead.invocation_id,
        dead.code,
        dead.reason,
        {"source_topic": dead.source_topic},
        original=dead.original,
    )
