"""The Python SDK for agent platforms and approval UIs, identical on both backends.

    from callgate.surfaces.sdk import connect
    from callgate.bootstrap import Settings

    gate = connect(Settings(state_dir=Path(".callgate")))
    answer = gate.propose(session=token, tool="tickets.read", args={"ticket_id": "T-1"})
    answer["outcome"]  # "executed"

A ``Gateway`` publishes request events and reads the projections; it never decides
anything itself: identity comes from the session token the decider verifies (C6).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from callgate.bootstrap import App, Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.approvals import peek_partition_key
from callgate.domain.canonical import partition_key
from callgate.domain.catalog import Profile
from callgate.domain.codes import Code, Rejection
from callgate.domain.limits import check_text_field, check_value, parse_args
from callgate.domain.principal import Principal
from callgate.domain.scope import OPERATOR_ROLE, bound_id, may_read
from callgate.domain.simulation import SimulationReport, Simulator
from callgate_projections.audit import VerifyResult, verify_chain


class Backend(Protocol):
    """What the SDK needs from a backend: publish requests, follow them, read views, wait."""

    def publish(self, events: Sequence[ev.Event]) -> None: ...

    def follow(
        self,
        request: ev.Event,
        view: str,
        key: str,
        done: Callable[[dict[str, Any]], bool],
        timeout_s: float,
    ) -> dict[str, Any] | None:
        """Publish ``request`` and return the value ``view`` holds at ``key`` once ``done``
        (the last value seen at the timeout; ``None`` if none). Its cost does not grow with
        history: Kafka reads the request's own partition from where it was written."""
        ...

    def view(self, view: str, key: str) -> dict[str, Any] | None: ...

    def partition_key_of(self, invocation_id: str) -> str | None:
        """The partition key of a known invocation (approve/deny publish with it)."""
        ...

    def view_items(self, view: str) -> list[tuple[str, dict[str, Any]]]: ...

    def view_items_raw(self, view: str) -> list[tuple[str, str]]:
        """The view as stored: key and canonical JSON value (replay compares bytes)."""
        ...

    def read_events(self, only: type[ev.Event] | None = None) -> Iterator[ev.Event]:
        """The authoritative ``events`` log from the start, in log order per partition
        (``only``: just the events of that class, the others skipped undecoded)."""
        ...

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool: ...

    def close(self) -> None: ...


class Gateway:
    """The client: ``propose``, ``pending``, ``approve``, ``deny``, ``status``, ``audit``."""

    def __init__(self, app: App, backend: Backend) -> None:
        self.app = app
        self.backend = backend

    # -- agent platforms --------------------------------------------------------------

    def propose(
        self,
        session: str,
        tool: str,
        args: Mapping[str, Any] | str,
        idempotency_key: str | None = None,
        approval_id: str | None = None,
        timeout_s: float = 30.0,
    ) -> dict[str, Any]:
        """Publish a proposal and wait until it settles (docs/contract.md "Command line").

        The limits of every entry (``callgate.domain.limits``) run first: arguments that
        break them, or text that cannot be encoded, raise ``Rejection(invalid_arguments)``
        and nothing is published. The invocation id is bound to ``session``
        (``callgate.domain.scope``), so no other session can address it.
        """
        limits = self.app.profile.limits
        if isinstance(args, str):
            parse_args(args, limits.max_args_bytes, limits.max_depth)
            args_json = args
        else:
            args_json = check_value(args, limits.max_args_bytes, limits.max_depth)
        for name, value in (
            ("session", session),
            ("tool", tool),
            ("idempotency_key", idempotency_key),
            ("approval_id", approval_id),
        ):
            if value is not None:
                check_text_field(name, value)
        invocation_id = bound_id(session, uuid.uuid4().hex)
        proposal = ev.ToolCallProposed(
            event_id=str(uuid.uuid4()),
            invocation_id=invocation_id,
            partition_key=_route(session, idempotency_key, approval_id, invocation_id),
            correlation_id=invocation_id,
            occurred_at=self.app.clock(),
            producer="callgate-sdk",
            session_token=session,
            tool=tool,
            args_json=args_json,
            idempotency_key=idempotency_key,
            approval_id=approval_id,
        )
        status = self.backend.follow(proposal, "status", invocation_id, _settled, timeout_s)
        return _answer(invocation_id, status)

    def answer(self, invocation_id: str) -> dict[str, Any]:
        """The ``propose`` answer shape for an invocation this client proposed, from its
        status (the id is bound to the proposing session: only its holder knows it)."""
        return _answer(invocation_id, self._status(invocation_id))

    # -- approval UIs -------------------------------------------------------------------

    def pending(self, session: str) -> list[dict[str, Any]]:
        """Pending approvals of the session's tenant (every tenant for an operator)."""
        reader = self._reader(session)
        rows = [
            v for _, v in self.backend.view_items("pending") if may_read(reader, v.get("tenant"))
        ]
        return sorted(rows, key=lambda r: (r.get("requested_at", 0), r["invocation_id"]))

    def approve(self, invocation_id: str, session: str, timeout_s: float = 30.0) -> dict[str, Any]:
        return self._decide(invocation_id, session, "grant", "", timeout_s)

    def deny(
        self, invocation_id: str, session: str, reason: str = "", timeout_s: float = 30.0
    ) -> dict[str, Any]:
        return self._decide(invocation_id, session, "deny", reason, timeout_s)

    def _decide(
        self, invocation_id: str, session: str, decision: str, reason: str, timeout_s: float
    ) -> dict[str, Any]:
        submit = ev.ApprovalDecisionSubmitted(
            event_id=bound_id(session, uuid.uuid4().hex),
            invocation_id=invocation_id,
            partition_key=self._partition_key_of(invocation_id, session),
            correlation_id=invocation_id,
            occurred_at=self.app.clock(),
            producer="callgate-sdk",
            session_token=session,
            decision=decision,
            reason=reason,
        )
        answer = self.backend.follow(submit, "decisions", submit.event_id, bool, timeout_s)
        if answer is None:
            raise TimeoutError(
                f"no answer to the {decision} of {invocation_id} within {timeout_s}s"
            )
        if answer.get("decision") == "rejected":
            err = answer["error"]
            raise Rejection(Code(err["code"]), err["message"])
        return {k: v for k, v in answer.items() if v is not None}

    def _partition_key_of(self, invocation_id: str, session: str) -> str:
        """Where the decision goes: the invocation's partition key (the decider answers,
        ``not_pending`` when it is not pending). An invocation of another tenant than the
        session's is ``not_pending`` too: its existence is not revealed."""
        found = self.backend.partition_key_of(invocation_id)
        record = None if found is None else self.backend.view("pending", invocation_id)
        if found is not None and record is None:
            record = self._status(invocation_id)
        if (
            found is None
            or record is None
            or not may_read(self._reader(session), record.get("tenant"))
        ):
            raise Rejection(Code.NOT_PENDING, f"no invocation {invocation_id}")
        return found

    # -- everyone -----------------------------------------------------------------------

    def _reader(self, session: str) -> Principal:
        """The verified reader (``unauthenticated`` otherwise): reads are tenant-scoped."""
        return self.app.session_verifier.verify(session, self.app.clock())

    def _status(self, invocation_id: str) -> dict[str, Any] | None:
        return self.backend.view("status", invocation_id)

    def status(self, invocation_id: str, session: str) -> dict[str, Any] | None:
        """An invocation's status, if it belongs to the session's tenant (any tenant for a
        session with the operator role, ``callgate.domain.scope.OPERATOR_ROLE``)."""
        reader = self._reader(session)
        status = self._status(invocation_id)
        return status if status is not None and may_read(reader, status.get("tenant")) else None

    def audit(self, invocation_id: str | None = None, *, session: str) -> list[dict[str, Any]]:
        """Audit records of the session's tenant (every tenant for an operator)."""
        reader = self._reader(session)
        rows = [v for _, v in self.backend.view_items("audit") if may_read(reader, _tenant_of(v))]
        if invocation_id is not None:
            rows = [r for r in rows if r.get("invocation_id") == invocation_id]
        return sorted(rows, key=lambda r: (r.get("partition_key", ""), r.get("seq", 0)))

    def simulate(
        self,
        candidate: Profile,
        *,
        session: str,
        tenant: str | None = None,
        since_ms: int | None = None,
        workers: int | None = None,
    ) -> SimulationReport:
        """Every recorded decision decided again under ``candidate``: what would change.

        An operator's read of every tenant's history (``operator_required`` otherwise);
        nothing is published and no provider is called (``callgate.domain.simulation``).
        """
        reader = self._reader(session)
        if not reader.has_any_role((OPERATOR_ROLE,)):
            raise Rejection(
                Code.OPERATOR_REQUIRED, f"policy simulate needs the {OPERATOR_ROLE} role"
            )
        from callgate.ops.simulate import simulate

        live = self.app.profile
        simulator = Simulator(candidate, known={live.digest: live})
        decisions = [
            e for e in self.backend.read_events(only=ev.PolicyDecided)
            if isinstance(e, ev.PolicyDecided)
        ]  # fmt: skip
        return simulate(
            simulator,
            decisions,
            lambda invocation_id: (self._status(invocation_id) or {}).get("outcome"),
            tenant=tenant,
            since_ms=since_ms,
            workers=workers,
        )

    def verify_audit(self, tenant: str | None = None) -> VerifyResult:
        """Check every per-partition hash chain against its head (detects a cut-off tail).

        With ``tenant``, only the chains holding that tenant's records (a partition key
        hashes the tenant, so those chains hold no other tenant's records).
        """
        heads = [value for _, value in self.backend.view_items("audit_head")]
        records = sorted(
            (value for _, value in self.backend.view_items("audit")),
            key=lambda r: (r.get("partition_key", ""), r.get("seq", 0)),
        )
        if tenant is not None:
            mine = {r.get("partition_key") for r in records if _tenant_of(r) == tenant}
            records = [r for r in records if r.get("partition_key") in mine]
            heads = [h for h in heads if h.get("partition_key") in mine]
        return verify_chain(records, heads=heads)

    def effects(self) -> list[dict[str, Any]]:
        return list(self.app.ledger.effects())

    def close(self) -> None:
        self.backend.close()


def _tenant_of(record: Mapping[str, Any]) -> object:
    """The tenant an audit record belongs to (its verified principal's), or None."""
    principal = (record.get("authorized_by") or {}).get("principal") or {}
    return principal.get("tenant") if isinstance(principal, Mapping) else None


def _settled(status: Mapping[str, Any]) -> bool:
    return bool(status.get("settled"))


def _answer(invocation_id: str, status: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``propose`` answer shape for an invocation, from its status value."""
    if status is None:
        return {"invocation_id": invocation_id, "outcome": Code.ALLOWED.value, "settled": False}
    out: dict[str, Any] = {
        "invocation_id": invocation_id,
        "outcome": status["outcome"],
        "settled": bool(status.get("settled")),
    }
    if status.get("error"):
        out["error"] = status["error"]
    if status.get("result") is not None:
        out["result"] = status["result"]
    if status.get("dry_run") is not None:
        out["dry_run"] = status["dry_run"]
    approval = status.get("approval") or {}
    if approval.get("approval_id"):
        out["approval_id"] = approval["approval_id"]
    if status.get("replay_of"):
        out["replay_of"] = status["replay_of"]
    return out


def _route(session: str, key: str | None, approval_id: str | None, invocation_id: str) -> str:
    """The partition key: the decider re-derives it from the verified session (C8)."""
    if key is not None:
        return partition_key(_unverified_tenant(session), key, invocation_id)
    if approval_id is not None:
        # The approved invocation's partition; "" when the artifact names none, which is
        # where the decider expects it (and then refuses it as approval_missing).
        return peek_partition_key(approval_id) or ""
    return partition_key("", None, invocation_id)


def _unverified_tenant(token: str) -> str:
    """Routing only; the decider verifies the token and rejects a misrouted call."""
    import jwt

    try:
        tenant = jwt.PyJWS().decode_complete(token, options={"verify_signature": False})
        value = json.loads(tenant["payload"]).get("tenant", "")
    except (jwt.PyJWTError, ValueError, AttributeError, TypeError):
        return ""
    return value if isinstance(value, str) else ""


def connect(settings: Settings, app: App | None = None) -> Gateway:
    """A gateway on the backend the settings name (embedded by default)."""
    app = app or bootstrap(settings)
    if settings.backend == "kafka":
        from callgate.adapters.kafka.gateway import KafkaBackend

        return Gateway(app, KafkaBackend(app))
    from callgate.adapters.embedded.gateway import EmbeddedBackend

    return Gateway(app, EmbeddedBackend(app))


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
