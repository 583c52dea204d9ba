"""Drives hostile cases (``tests.fuzz.strategies``) through a real backend and checks them.

A ``Campaign`` owns one SDK ``Gateway`` (embedded or Kafka). For each case it builds the
request as a hostile client would (raw on ``requests``, or through the SDK), waits for it,
and keeps the figures the issue asks for:

- every proposal that may be answered (its invocation id is bound to its session) settles,
  within ``settle_s``, with one code of the vocabulary; one that does not is a **stall**,
  and so is a sentinel (a legitimate call under the shared keys of each tenant, i.e. on the
  partitions the hostile input went to) that does not execute in time: a watchdog on
  progress;
- an invocation id reused by another session (**collision**) never changes the status of
  the invocation it names (tenant, actor, outcome, partition);
- every effect in the provider ledger belongs to a call a genuine session was allowed to
  make with no confirmation (no campaign grants approvals): any other is an
  **unauthorized effect**;
- sessions signed by the trusted issuer with other spellings of a tenant or role (``ACME``,
  ``Admin``, full width, look-alikes, any text) read each tenant's ticket, delete a user and
  approve a deploy: a **grant across principals** is any of these allowed where the exact
  tenant or role does not allow it (identifiers compare exactly, docs/contract.md);
- the codes seen, the proposals made (SDK calls, raw records and sentinels) and how many
  inputs the SDK refused before publishing.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import jwt

from callgate.adapters.avro_codec import MalformedEvent
from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.codes import Code, Rejection
from callgate.domain.identity import AUDIENCE, DEV_ISSUER
from callgate.domain.principal import looks_alike
from callgate.domain.scope import OPERATOR_ROLE, bound_id
from callgate.surfaces.sdk import Gateway
from tests.attacks import hs256_token, tamper_payload
from tests.fuzz.strategies import NO_CONFIRMATION, SHARED_KEYS, USERS, Case, TokenSpec, b64

VOCABULARY = frozenset(c.value for c in Code)
GENUINE = frozenset(USERS)
GRANTED = frozenset(
    {Code.EXECUTED.value, Code.REPLAYED.value, Code.ALLOWED.value, Code.APPROVAL_REQUIRED.value}
)


@dataclass
class Figures:
    inputs: int = 0
    proposals: int = 0  # every call proposed at an entry (SDK or raw record), sentinels too
    stalls: int = 0
    unauthorized_effects: int = 0
    collisions_tried: int = 0
    overwrites: int = 0
    refused_at_entry: int = 0
    approvals_tried: int = 0
    self_approvals: int = 0
    spelled_tried: int = 0
    grants_across: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    def report(self) -> str:
        codes = ", ".join(f"{c} {n}" for c, n in sorted(self.codes.items()))
        return (
            f"inputs tried: {self.inputs}\n"
            f"proposals made: {self.proposals}\n"
            f"stalls: {self.stalls}\n"
            f"unauthorized effects: {self.unauthorized_effects}\n"
            f"cross-tenant collisions tried: {self.collisions_tried}, overwrites: "
            f"{self.overwrites}\n"
            f"refused at the entry (SDK limits): {self.refused_at_entry}\n"
            f"approvals under another spelling tried: {self.approvals_tried}, self-approvals "
            f"granted: {self.self_approvals}\n"
            f"calls and approvals under other tenant/role spellings (trusted issuer): "
            f"{self.spelled_tried}, grants across principals: {self.grants_across}\n"
            f"distinct codes seen: {len(self.codes)} ({codes})"
        )

    def ok(self) -> bool:
        bad = (
            self.stalls
            or self.unauthorized_effects
            or self.overwrites
            or self.self_approvals
            or self.grants_across
        )
        return not (bad or self.problems)


class Campaign:
    """Hostile cases through one gateway; ``figures`` says what happened (module doc)."""

    def __init__(
        self,
        gate: Gateway,
        settle_s: float,
        sentinel_every: int = 25,
    ) -> None:
        self.gate = gate
        self.app = gate.app
        self.settle_s = settle_s
        self.sentinel_every = sentinel_every
        self.figures = Figures()
        self.ops = self.issue("fuzz-operator", "ops", (OPERATOR_ROLE,))
        self.legit: set[str] = set()  # invocations that may have effects
        # (id, its status's identity, the token it was bound to)
        self.genuine_invocations: list[tuple[str, dict[str, Any], str]] = []
        self._n = 0

    def _propose(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.figures.proposals += 1
        answer: dict[str, Any] = self.gate.propose(*args, **kwargs)
        return answer

    # -- tokens -------------------------------------------------------------------------

    def issue(self, user: str, tenant: str, roles: tuple[str, ...], ttl: int = 86_400) -> str:
        return self.app.session_issuer.issue(user, tenant, list(roles), self.app.clock(), ttl)

    def genuine(self, user: str) -> str:
        tenant, roles = USERS[user]
        return self.issue(user, tenant, roles)

    def token(self, spec: TokenSpec) -> str:
        now_s = self.app.clock() // 1000
        kid = self.app.keys.session_kid
        claims: dict[str, Any] = {
            "sub": "alice", "tenant": "acme", "roles": ["admin"], "iat": now_s, "nbf": now_s,
            "exp": now_s + 3600, "iss": DEV_ISSUER, "aud": AUDIENCE, "sid": "s-fuzz",
        }  # fmt: skip
        match spec.kind:
            case "alice" | "gina":
                return self.genuine(spec.kind)
            case "expired":
                return self.app.session_issuer.issue(
                    "alice", "acme", ["admin"], self.app.clock() - 7_200_000, 3600
                )
            case "alg-none":
                return jwt.encode(claims, "", algorithm="none", headers={"kid": kid})
            case "alg-none-strange":
                claims[spec.claim] = spec.value
                header = b64(json.dumps({"alg": "none", "kid": kid}).encode())
                body = b64(json.dumps(claims).encode("utf-8", "surrogatepass"))
                return f"{header}.{body}."
            case "hs256":
                return hs256_token(self.app, self.app.clock())
            case "garbage-header":
                return b64(b"\xff\xfe not json") + "." + b64(b"{}") + ".c2ln"
            case "tampered":
                return tamper_payload(self.genuine("alice"), tenant="globex", roles=["admin"])
            case "truncated":
                return self.genuine("alice")[:-10]
            case "empty":
                return ""
        return "junk"

    # -- one case -----------------------------------------------------------------------

    def feed(self, case: Case) -> None:
        self.figures.inputs += 1
        token = self.token(case.token)
        if case.through_sdk:
            self._through_sdk(case, token)
        else:
            self._raw(case, token)
        if case.impostor is not None:
            self._impostor_calls(*case.impostor)
        if case.approver is not None:
            tenant, roles = case.impostor or ("acme", ("release-manager",))
            self._approve_under(case.approver, tenant, roles)
        self._n += 1
        if self._n % self.sentinel_every == 0:
            self.watchdog()

    def _impostor_calls(self, tenant: str, roles: tuple[str, ...]) -> None:
        """A trusted session of ``tenant`` with ``roles`` reads acme's and globex's ticket and
        deletes acme's user: allowed only where the exact tenant owns the resource and an
        exact role of the tool's callers is held."""
        try:
            token = self.issue("ivan", tenant, roles)
        except ValueError:
            return  # the issuer refuses an empty tenant
        calls = (
            ("tickets.read", {"ticket_id": "T-1"}, "acme", {"support", "admin"}),
            ("tickets.read", {"ticket_id": "GT-1"}, "globex", {"support", "admin"}),
            ("users.delete", {"user_id": "U-1"}, "acme", {"admin"}),
        )
        for tool, args, owner, callers in calls:
            self.figures.spelled_tried += 1
            answer = self._propose(token, tool, args, timeout_s=self.settle_s)
            outcome = str(answer.get("outcome"))
            self._code(outcome, f"spelled {answer}")
            granted = outcome in GRANTED
            exact = tenant == owner and bool(callers & set(roles))
            if granted and exact:
                self.legit.add(str(answer["invocation_id"]))
            elif granted:
                self.figures.grants_across += 1
                self.figures.problems.append(
                    f"{tool} {args} granted to tenant {tenant!r} roles {roles!r}: {outcome}"
                )

    def _approve_under(self, spelling: str, tenant: str, roles: tuple[str, ...]) -> None:
        """rita's high-impact deploy, approved by a session (``spelling``, ``tenant``,
        ``roles``): granted only to another user than rita, and no look-alike of her, of
        exactly acme holding exactly release-manager."""
        rita = self.issue("rita", "acme", ("release", "release-manager"))
        deploy = {"service": "billing", "version": "1", "environment": "production"}
        first = self._propose(rita, "deploys.trigger", deploy, timeout_s=self.settle_s)
        if first.get("outcome") != Code.APPROVAL_REQUIRED.value:
            self._stall(f"rita's deploy did not stop for approval: {first}")
            return
        try:
            approver = self.issue(spelling, tenant, roles)
        except ValueError:
            return  # the issuer refuses an empty user id: nobody to approve as
        self.figures.approvals_tried += 1
        self.figures.spelled_tried += 1
        try:
            self.gate.approve(str(first["invocation_id"]), approver, timeout_s=self.settle_s)
        except Rejection as r:
            self._code(r.code.value, "approval refusal")
            return
        if looks_alike(spelling, "rita"):
            self.figures.self_approvals += 1
            self.figures.problems.append(f"rita approved her own deploy as {spelling!r}")
        elif tenant != "acme" or "release-manager" not in roles:
            self.figures.grants_across += 1
            self.figures.problems.append(
                f"approval granted to tenant {tenant!r} roles {roles!r} as {spelling!r}"
            )

    def _through_sdk(self, case: Case, token: str) -> None:
        answer = self._propose(token, case.tool, case.args_json, case.key, timeout_s=self.settle_s)
        if answer["invocation_id"] is None:
            self.figures.refused_at_entry += 1
            self._code(str(answer["outcome"]), "sdk refusal")
            return
        inv = str(answer["invocation_id"])
        if case.token.kind in GENUINE and case.tool in NO_CONFIRMATION:
            self.legit.add(inv)
        if not answer.get("settled"):
            self._stall(f"sdk call {inv} did not settle: {answer}")
            return
        self._code(str(answer["outcome"]), f"sdk answer {answer}")
        self._remember(inv, token, case)

    def _raw(self, case: Case, token: str) -> None:
        nonce = uuid.uuid4().hex
        inv = self._invocation_id(case, token, nonce)
        p = ev.ToolCallProposed(
            event_id=str(uuid.uuid4()),
            invocation_id=inv,
            partition_key=self._route(case, token, inv),
            session_token=token,
            tool=case.tool,
            args_json=case.args_json,
            idempotency_key=case.key,
        )
        victim = self._victim_before(inv)
        self.figures.proposals += 1
        try:
            self.gate.backend.publish([p])
        except (MalformedEvent, Rejection):
            self.figures.refused_at_entry += 1  # cannot even be encoded as a record
            self._code(Code.INVALID_ARGUMENTS.value, "unencodable")
            return
        bound = case.id_kind == "bound"
        genuine = case.token.kind in GENUINE and case.tool in NO_CONFIRMATION
        if bound and genuine and case.route == "right":
            self.legit.add(inv)
        if bound:
            status = self._settle(inv)
            if status is None:
                self._stall(f"raw proposal {inv} ({case}) did not settle")
                return
            self._code(str(status["outcome"]), f"status {status}")
            self._remember(inv, token, case)
        elif victim is not None:
            self.watchdog()  # the colliding record has been processed once the sentinels run
            self._check_victim(*victim)

    def _invocation_id(self, case: Case, token: str, nonce: str) -> str:
        match case.id_kind:
            case "bound":
                return bound_id(token, nonce)
            case "another-session":
                return bound_id(
                    self.genuine("gina" if case.token.kind == "alice" else "alice"), nonce
                )
            case "collide" if self.genuine_invocations:
                # another session's invocation (two tokens issued in one second for one
                # user are one session: reusing one's own id only confuses oneself)
                others = [i for i, _, t in self.genuine_invocations if t != token]
                if others:
                    self.figures.collisions_tried += 1
                    return others[int(nonce[:8], 16) % len(others)]
            case "strange":
                return ("", ".", "x" * 300, "\u0000", "inv.", f"{nonce}.")[int(nonce[0], 16) % 6]
        return f"inv-{nonce}"

    def _route(self, case: Case, token: str, inv: str) -> str:
        claimed = _unverified_tenant(token)
        match case.route:
            case "other-tenant":
                other = "globex" if claimed == "acme" else "acme"
                return partition_key(other, case.key or "K", inv)
            case "anywhere":
                return "p-" + inv[:8]
        return partition_key(claimed if case.key is not None else "", case.key, inv)

    # -- checks ---------------------------------------------------------------------------

    def _settle(self, inv: str) -> dict[str, Any] | None:
        done = self.gate.backend.wait(
            lambda: bool((self.gate.status(inv, self.ops) or {}).get("settled")), self.settle_s
        )
        return self.gate.status(inv, self.ops) if done else None

    def _code(self, code: str, where: str) -> None:
        self.figures.codes[code] += 1
        if code not in VOCABULARY:
            self.figures.problems.append(f"{code!r} is not a vocabulary code ({where})")

    def _stall(self, what: str) -> None:
        self.figures.stalls += 1
        self.figures.problems.append(what)

    def _remember(self, inv: str, token: str, case: Case) -> None:
        if case.token.kind in GENUINE and len(self.genuine_invocations) < 200:
            # The settled status: on Kafka the SDK's answer comes from the events log, before
            # the status view has caught up, so the view may still say "allowed" here, and
            # its settling later would look like a change made by a colliding request.
            status = self._settle(inv)
            if status is not None and status.get("tenant"):
                self.genuine_invocations.append((inv, _identity(status), token))

    def _victim_before(self, inv: str) -> tuple[str, dict[str, Any]] | None:
        for known, identity, _ in self.genuine_invocations:
            if known == inv:
                return known, identity
        return None

    def _check_victim(self, inv: str, before: dict[str, Any]) -> None:
        now = self.gate.status(inv, self.ops)
        if now is None or _identity(now) != before:
            self.figures.overwrites += 1
            self.figures.problems.append(f"{inv} changed by a colliding request: {now}")

    def watchdog(self) -> None:
        """Legitimate reads of each tenant, with no key and under fresh keys (so on several
        partitions): each must execute within ``settle_s``. On the embedded backend one
        stuck row would stop them all; on Kafka they land on every partition but rarely."""
        for user in sorted(USERS):
            token = self.genuine(user)
            ticket = "T-1" if user == "alice" else "GT-1"
            for key in (None, *SHARED_KEYS):
                probe = f"{key}-probe-{uuid.uuid4().hex}" if key else None
                answer = self._propose(
                    token, "tickets.read", {"ticket_id": ticket}, probe, timeout_s=self.settle_s
                )
                self.legit.add(str(answer["invocation_id"]))
                if answer.get("outcome") not in (Code.EXECUTED.value, Code.REPLAYED.value):
                    self._stall(f"sentinel for {user}/{key} did not execute: {answer}")

    def check_effects(self) -> None:
        for effect in self.gate.effects():
            if effect.get("invocation_id") not in self.legit:
                self.figures.unauthorized_effects += 1
                self.figures.problems.append(f"unauthorized effect {effect}")


def _identity(status: dict[str, Any]) -> dict[str, Any]:
    keys = ("tenant", "actor", "outcome", "partition_key", "tool")
    return {k: status.get(k) for k in keys}


def _unverified_tenant(token: str) -> str:
    try:
        payload = jwt.PyJWS().decode_complete(token, options={"verify_signature": False})
        value = json.loads(payload["payload"]).get("tenant", "")
    except (jwt.PyJWTError, ValueError, AttributeError, TypeError):
        return ""
    return value if isinstance(value, str) else ""
