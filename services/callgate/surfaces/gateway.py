"""The client over a backend: ``Gateway`` publishes request events and reads the projections;
it never decides anything itself: identity comes from the session token the decider verifies
(C6). ``callgate.surfaces.sdk.connect`` (an entry point) gives one wired by the composition
root; ``Surface`` is what the surfaces need from that root, as a port.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from callgate.adapters.wiring import Wiring
from callgate.domain import events as ev
from callgate.domain.canonical import canonical_json, partition_key
from callgate.domain.catalog import Profile
from callgate.domain.codes import Code, Rejection
from callgate.domain.limits import check_text_field, check_value, parse_args
from callgate.domain.principal import Principal
from callgate.domain.scope import OPERATOR_ROLE, bound_id, is_bound, may_read

if TYPE_CHECKING:
    # Type-only here; the methods that use them import them, so ``callgate propose`` as
    # a new process loads neither the policy engine (Cedar) nor simulation, pinning or
    # the audit chain.
    from callgate.adapters.notify import Notifier, PendingReader, SlackInteractions
    from callgate.adapters.oidc import Discovery
    from callgate.config import ApprovalKeys
    from callgate.domain.catalog import Profile
    from callgate.domain.identity import SessionIssuer, SessionVerifier, TrustedIssuer
    from callgate.domain.pins import Pins
    from callgate.domain.policy_versions import PolicyVersions
    from callgate.domain.simulation import SimulationReport
    from callgate.providers.channels import Channel
    from callgate.providers.ledger import EffectLedger
    from callgate.providers.registry import ProviderRegistry
    from callgate_projections.audit import VerifyResult


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

    def read_events(
        self, only: type[ev.Event] | tuple[type[ev.Event], ...] | None = None
    ) -> Iterator[ev.Event]:
        """The authoritative ``events`` log from the start, in log order per partition
        (``only``: just the events of that class or classes, the others skipped undecoded)."""
        ...

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool: ...

    def close(self) -> None: ...


class Surface(Wiring, Protocol):
    """What surfaces need from the composition root (``callgate.bootstrap.App``)."""

    @property
    def profile(self) -> Profile: ...
    @property
    def session_verifier(self) -> SessionVerifier: ...
    @property
    def session_issuer(self) -> SessionIssuer: ...
    @property
    def approval_keys(self) -> ApprovalKeys: ...
    @property
    def ledger(self) -> EffectLedger: ...
    @property
    def providers(self) -> ProviderRegistry: ...
    @property
    def discovery(self) -> Discovery:
        """The identity providers' discovery documents and keys."""
        ...

    @property
    def trusted_issuers(self) -> list[TrustedIssuer]:
        """The configured session issuers (keys, claims mapping, binding)."""
        ...

    @property
    def request_state_key(self) -> bytes:
        """The key sealing MCP ``requestState`` (ADR 0065)."""
        ...

    @property
    def slack_interactions(self) -> SlackInteractions | None:
        """Slack's Approve/Deny clicks (``[slack]``), None when Slack is not configured."""
        ...

    def notifier(self, reader: PendingReader) -> Notifier | None:
        """Tells approvers of the pending view's changes (``[notify]``, ``[slack]``)."""
        ...

    def gateway(self) -> Gateway:
        """A client on the backend the settings name (embedded by default)."""
        ...


class Gateway:
    """The client: ``propose``, ``pending``, ``approve``, ``deny``, ``status``, ``audit``."""

    def __init__(self, app: Surface, backend: Backend) -> None:
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
        wait: float | None = None,
        traceparent: str | None = None,
        trace_attributes: Mapping[str, Any] | None = None,
        channel: Channel | None = None,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Publish a proposal and wait until it settles (docs/contract.md "Command line").

        Traced (``[tracing]``, ADR 0036), the call is the span ``execute_tool {tool}``, a
        child of ``traceparent`` (the caller's W3C trace context) when given;
        ``trace_attributes`` are the surface's own (MCP's ``mcp.method.name``, ...).

        With ``wait`` (seconds), a call that needs approval is waited on further until
        its final outcome (``Gateway.wait``, ADR 0029): executed or failed once approved,
        ``approval_denied``, ``approval_expired``, or still ``approval_required`` (with the
        invocation id to wait on again) when ``wait`` runs out; ``on_change`` sees each
        status meanwhile (``Gateway.wait``).

        The limits of every entry (``callgate.domain.limits``) run first: arguments that
        break them, or text that cannot be encoded, are refused before anything is
        published, answered in the one shape of a refused call (``refusal``) with no
        invocation id: ``{"outcome": "invalid_arguments", "error": {...}}``. The
        invocation id is bound to ``session`` (``callgate.domain.scope``), so no other
        session can address it.

        ``channel`` receives what the upstream sends during the call (progress, log
        messages, its requests to the agent) while this method waits, when the call is
        executed in this process (``providers.channels``).
        """
        tracing = self.app.tracing
        if tracing is None:
            return self._propose(
                session, tool, args, idempotency_key, approval_id, timeout_s, wait, channel,
                on_change,
            )  # fmt: skip
        with tracing.proposal(tool, traceparent, trace_attributes) as span:
            answer = self._propose(
                session, tool, args, idempotency_key, approval_id, timeout_s, wait, channel,
                on_change,
            )  # fmt: skip
            if answer.get("invocation_id"):
                span.set_attribute("callgate.invocation_id", str(answer["invocation_id"]))
            if answer.get("outcome"):
                span.set_attribute("callgate.outcome", str(answer["outcome"]))
            return answer

    def _propose(
        self,
        session: str,
        tool: str,
        args: Mapping[str, Any] | str,
        idempotency_key: str | None,
        approval_id: str | None,
        timeout_s: float,
        wait: float | None,
        channel: Channel | None = None,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        try:
            args_json = self._entry_checks(session, tool, args, idempotency_key, approval_id)
        except Rejection as r:
            return refusal(r)
        invocation_id = bound_id(session, uuid.uuid4().hex)
        proposal = ev.ToolCallProposed(
            event_id=str(uuid.uuid4()),
            invocation_id=invocation_id,
            partition_key=_route(
                session,
                idempotency_key,
                approval_id,
                invocation_id,
                self._routing_tenant(session) if idempotency_key is not None else None,
            ),
            correlation_id=invocation_id,
            occurred_at=self.app.clock(),
            producer="callgate-sdk",
            session_token=session,
            tool=tool,
            args_json=args_json,
            idempotency_key=idempotency_key,
            approval_id=approval_id,
        )
        if channel is None:
            status = self.backend.follow(proposal, "status", invocation_id, _settled, timeout_s)
        else:
            from callgate.providers.channels import CHANNELS

            CHANNELS.open(invocation_id, channel)
            try:
                status = self.backend.follow(proposal, "status", invocation_id, _settled, timeout_s)
            finally:
                CHANNELS.close(invocation_id)
        if wait is not None and status is not None:
            # Waited on, the answer has one shape whether the first status seen is final
            # already (an approval given before the follower read the request's events)
            # or not: ``final_answer``, as ``wait`` gives.
            if not self.is_final(status):
                return self.wait(invocation_id, session, wait, on_change)
            return final_answer(invocation_id, status)
        return _answer(invocation_id, status)

    def evaluate(
        self,
        calls: Sequence[tuple[str, str, Mapping[str, Any]]],
        timeout_s: float = 30.0,
    ) -> list[dict[str, Any]]:
        """Decide each ``(session, tool, args)`` as that session's call, and run none
        (ADR 0083).

        Each is a proposal with ``evaluate_only``: the decider takes it through the same
        checks as any call (session, catalog, schema, identity, freeze, pin, policy) and
        records its ``PolicyDecided`` (or the refusal), which settles it as ``permitted``,
        ``approval_required`` or a refusal; the audit and ``policy simulate`` see it like
        any decision. All are published in one append and waited on together: a batch is
        one round trip. The answers are in ``propose``'s shape, in order; one refused by
        the limits of every entry has no invocation id (nothing was published for it)."""
        answers: list[dict[str, Any] | None] = []
        proposals: list[ev.ToolCallProposed] = []
        for session, tool, args in calls:
            try:
                args_json = self._entry_checks(session, tool, args, None, None)
            except Rejection as r:
                answers.append(refusal(r))
                continue
            invocation_id = bound_id(session, uuid.uuid4().hex)
            proposals.append(
                ev.ToolCallProposed(
                    event_id=str(uuid.uuid4()),
                    invocation_id=invocation_id,
                    partition_key=_route(session, None, None, invocation_id),
                    correlation_id=invocation_id,
                    occurred_at=self.app.clock(),
                    producer="callgate-authzen",
                    session_token=session,
                    tool=tool,
                    args_json=args_json,
                    evaluate_only=True,
                )
            )
            answers.append(None)
        if proposals:
            self.backend.publish(proposals)
            ids = [p.invocation_id for p in proposals]
            self.backend.wait(lambda: all(_settled(self._status(i) or {}) for i in ids), timeout_s)
        published = iter(proposals)
        return [a if a is not None else self.answer(next(published).invocation_id) for a in answers]

    def is_final(self, status: Mapping[str, Any]) -> bool:
        """``is_final``, knowing from the catalog whether the tool's calls continue."""
        spec = self.app.profile.tool(str(status.get("tool") or ""))
        return is_final(status, None if spec is None else spec.continue_on_approval)

    def wait(
        self,
        invocation_id: str,
        session: str,
        timeout_s: float = 30.0,
        on_change: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """The invocation's final outcome, waiting up to ``timeout_s`` for it (ADR 0029).

        Final: settled, and not an approval that is pending or granted and continuing.
        A denied or expired approval is answered as ``approval_denied`` /
        ``approval_expired``; at the timeout the answer is the current one (usually
        ``approval_required``, ``settled`` true, ``final`` false). ``on_change`` is
        called with each new status value (progress on a terminal, SSE). Only the
        session's tenant can be waited on (``not_found`` otherwise).
        """
        reader = self._reader(session)
        last: dict[str, Any] | None = None

        def done() -> bool:
            nonlocal last
            status = self._status(invocation_id)
            if status is not None and not may_read(reader, status.get("tenant")):
                raise Rejection(Code.NOT_FOUND, f"no invocation {invocation_id}")
            if status != last and status is not None and on_change is not None:
                on_change(status)
            last = status
            return status is not None and self.is_final(status)

        self.backend.wait(done, timeout_s)
        if last is None:
            if is_bound(invocation_id, session):  # formed by this session: not decided yet
                return {**undecided(invocation_id), "final": False}
            raise Rejection(Code.NOT_FOUND, f"no invocation {invocation_id}")
        return final_answer(invocation_id, last)

    def _entry_checks(
        self,
        session: str,
        tool: str,
        args: Mapping[str, Any] | str,
        idempotency_key: str | None,
        approval_id: str | None,
    ) -> str:
        """The limits of every entry; the arguments' JSON text."""
        limits = self.app.profile.entry_limits
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
        return args_json

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

    def resumable(self, session: str, tool: str, args: Mapping[str, Any]) -> str | None:
        """The pending approval of the session's principal for the same call: the same
        tool, actor and tenant, and arguments that normalize to the same hash (the one the
        approval binds, C11); the newest, unexpired. This is how the same call made again
        finds its invocation from any process (ADR 0029); None when there is none, or
        when the session or the arguments are refused (the call is then proposed and
        refused as usual)."""
        from callgate.domain.arguments import normalize_args
        from callgate.domain.canonical import args_hash, canonical_json

        spec = self.app.profile.tool(tool)
        if spec is None:
            return None
        try:
            principal = self._reader(session)
            normalized = normalize_args(spec, self.app.profile.entry_limits, canonical_json(args))
        except (Rejection, ValueError, TypeError):
            return None
        wanted, now = args_hash(normalized), self.app.clock()
        rows = [
            row
            for row in self.pending(session)
            if row.get("tool") == tool
            and row.get("tenant") == principal.tenant
            and row.get("actor") == principal.user
            and row.get("args_hash") == wanted
            and int(row.get("expires_at") or 0) > now
        ]
        return str(rows[-1]["invocation_id"]) if rows else None

    def approve(self, invocation_id: str, session: str, timeout_s: float = 30.0) -> dict[str, Any]:
        return self._decide(invocation_id, session, "grant", "", timeout_s)

    def deny(
        self, invocation_id: str, session: str, reason: str = "", timeout_s: float = 30.0
    ) -> dict[str, Any]:
        return self._decide(invocation_id, session, "deny", reason, timeout_s)

    def withdraw(
        self, invocation_id: str, session: str, reason: str = "", timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """The actor withdraws their own pending call (MCP ``tasks/cancel``, ADR 0086): the
        decider records it as denied, so it never runs; ``not_pending`` once decided."""
        return self._decide(invocation_id, session, ev.WITHDRAW, reason, timeout_s)

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
        deadline = time.monotonic() + timeout_s
        answer = self.backend.follow(submit, "decisions", submit.event_id, _answered, timeout_s)
        if answer is None:
            raise TimeoutError(
                f"no answer to the {decision} of {invocation_id} within {timeout_s}s"
            )
        if answer.get("decision") == "rejected":
            err = answer["error"]
            raise Rejection(Code(err["code"]), err["message"])
        result = {k: v for k, v in answer.items() if v is not None}
        if "approval_id" in result:
            # ADR 0029: a granted approval continues the invocation; tell the approver
            # what became of it (bounded by the same timeout; a server may still be at it).
            status: dict[str, Any] | None = None

            def continued() -> bool:
                nonlocal status
                status = self._status(invocation_id)
                return status is not None and self.is_final(status)

            self.backend.wait(continued, max(0.0, deadline - time.monotonic()))
            if status is not None:
                result["outcome"] = final_answer(invocation_id, status)["outcome"]
        return result

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

    def _routing_tenant(self, session: str) -> str | None:
        """The tenant an idempotency key is scoped by, for routing: the verified session's
        (an issuer's claims mapping may take it from another claim, or a constant, ADR
        0078); ``None`` for a token that does not verify (routed by its unverified
        ``tenant`` claim, and refused by the decider in its order of checks)."""
        try:
            return self.app.session_verifier.verify(session, self.app.clock()).tenant
        except Rejection:
            return None

    def _reader(self, session: str) -> Principal:
        """The verified reader (``unauthenticated`` otherwise): reads are tenant-scoped."""
        return self.app.session_verifier.verify(session, self.app.clock())

    def _status(self, invocation_id: str) -> dict[str, Any] | None:
        return self.backend.view("status", invocation_id)

    def status(self, invocation_id: str, session: str) -> dict[str, Any] | None:
        """An invocation's status, if it belongs to the session's tenant (any tenant for a
        session with the operator role, ``callgate.domain.scope.OPERATOR_ROLE``); None when
        nothing is recorded of it (``status_or_undecided`` tells the session that formed
        the id why)."""
        reader = self._reader(session)
        status = self._status(invocation_id)
        return status if status is not None and may_read(reader, status.get("tenant")) else None

    def status_or_undecided(self, invocation_id: str, session: str) -> dict[str, Any] | None:
        """``status``; for an id bound to this very session (``is_bound``: only its holder
        formed it) of which nothing is recorded yet, ``pending_decision``: the call was
        published and is not decided, or its publishing failed (then the caller was answered
        ``broker_unavailable``). Never ``allowed`` for a call no policy decided."""
        reader = self._reader(session)
        status = self._status(invocation_id)  # one read of the view
        if status is None:
            return undecided(invocation_id) if is_bound(invocation_id, session) else None
        return status if may_read(reader, status.get("tenant")) else None

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
        """Every recorded decision decided again under ``candidate``: what would change,
        and the calls its limits would have refused.

        An operator's read of every tenant's history (``operator_required`` otherwise);
        nothing is published and no provider is called (``callgate.domain.simulation``).
        A candidate with limits reads what ended each call too, and takes the calls in the
        order of their times: the log orders them per partition only (Kafka), and a
        limit's scope spans partitions.
        """
        reader = self._reader(session)
        if not reader.has_any_role((OPERATOR_ROLE,)):
            raise Rejection(
                Code.OPERATOR_REQUIRED, f"policy simulate needs the {OPERATOR_ROLE} role"
            )
        from callgate.domain.simulated_usage import HISTORY_EVENTS
        from callgate.domain.simulation import Simulator
        from callgate.ops.simulate import simulate

        live = self.app.profile
        simulator = Simulator(candidate, known={live.digest: live})
        history = list(
            self.backend.read_events(only=HISTORY_EVENTS if candidate.limits else ev.PolicyDecided)
        )
        if candidate.limits:
            history.sort(key=lambda e: e.occurred_at)  # stable: the log's order at equal times
        return simulate(
            simulator,
            history,
            lambda invocation_id: (self._status(invocation_id) or {}).get("outcome"),
            tenant=tenant,
            since_ms=since_ms,
            workers=workers,
        )

    # -- policy versions (ADR 0050) -------------------------------------------------------

    def _operator(self, session: str, command: str) -> Principal:
        reader = self._reader(session)
        if not reader.has_any_role((OPERATOR_ROLE,)):
            raise Rejection(Code.OPERATOR_REQUIRED, f"{command} needs the {OPERATOR_ROLE} role")
        return reader

    def usage(
        self,
        session: str,
        limit: str | None = None,
        *,
        actor: str | None = None,
        tool: str | None = None,
    ) -> list[dict[str, Any]]:
        """Each limit's usage per scope (ADR 0079) of the session's tenant (every tenant for
        an operator), ``used`` counted now, ``limit`` only that one; busiest first.

        ``actor`` and ``tool``: only the scopes a call of ``tool`` by ``actor`` would count
        in (the limits of the profile that cover ``tool``, their scopes of that actor or
        of no actor, of that tool or of no tool), what an approver weighs beside it."""
        from callgate.domain.usage import used_now

        reader, now = self._reader(session), self.app.clock()
        covering = None if tool is None else {u.name for u in self.app.profile.limits_of(tool)}
        rows: list[dict[str, Any]] = []
        for key, v in self.backend.view_items("usage"):
            if not may_read(reader, v["scope"]["tenant"]) or limit not in (None, v["limit"]):
                continue
            if covering is not None and (
                v["limit"] not in covering or v["scope"]["tool"] not in (None, tool)
            ):
                continue
            if actor is not None and v["scope"]["actor"] not in (None, actor):
                continue
            scope = {k: x for k, x in v["scope"].items() if x is not None}
            rows.append(
                {"key": key, "limit": v["limit"], "scope": scope, "used": used_now(v, now),
                 "max": v["max"], "held": v["held"], "window_ms": v["window_ms"],
                 "raised": v["raised"], "changes": v["changes"]}
            )  # fmt: skip
        return sorted(rows, key=lambda r: (-r["used"] / max(1, r["max"]), r["limit"], r["key"]))

    def change_limit(
        self, limit: str, scope: Mapping[str, str], *, action: str, reason: str, session: str,
        raise_by: int = 0,
    ) -> ev.UsageLimitChanged:  # fmt: skip
        """An operator's ``limits reset`` or ``raise`` of one limit in one scope (ADR 0079):
        published as an event with author and reason, folded by the usage process (which
        answers every later reservation with it) and the usage view."""
        operator = self._operator(session, f"limits {action}")
        check_text_field("reason", reason)
        found = next((u for u in self.app.profile.limits if u.name == limit), None)
        if found is None:
            raise Rejection(Code.INVALID_REQUEST, f"no limit named {limit!r} in the profile")
        if action not in ("reset", "raise") or (action == "raise") != (raise_by > 0):
            raise Rejection(Code.INVALID_REQUEST, "reset, or raise by a positive amount")
        needed = {"tenant", *found.per}
        if set(scope) != needed or not all(scope.values()):
            raise Rejection(
                Code.INVALID_REQUEST,
                f"limit {limit} counts per {', '.join(sorted(needed))}: give exactly those",
            )
        values = {k: scope.get(k, "") for k in ("tenant", "actor", "agent", "tool")}
        key = found.scope_key(values["tenant"], values["actor"], values["agent"], values["tool"])
        event = ev.UsageLimitChanged(
            event_id=str(uuid.uuid4()),
            invocation_id=f"limits-{key}",
            partition_key=key,
            occurred_at=self.app.clock(),
            producer="callgate-sdk",
            limit=limit,
            scope_json=canonical_json(
                found.scope_of(values["tenant"], values["actor"], values["agent"], values["tool"])
            ),
            action=action,
            raise_by=raise_by,
            reason=reason,
            author=operator.user,
            tenant=operator.tenant,
        )
        self.backend.publish([event])
        return event

    def policy_versions(self) -> PolicyVersions:
        """The policy-version events of the log, folded in log order."""
        from callgate.domain.policy_versions import POLICY_EVENTS, fold

        return fold([e for e in self.backend.read_events() if isinstance(e, POLICY_EVENTS)])

    def _policy_event(
        self, cls: Callable[..., ev.Event], operator: Principal, version: str, reason: str,
        **fields: str,
    ) -> ev.Event:  # fmt: skip
        check_text_field("reason", reason)
        event = cls(
            event_id=str(uuid.uuid4()),
            invocation_id=f"policy-{version or 'off'}",
            partition_key=ev.POLICY_KEY,
            occurred_at=self.app.clock(),
            producer="callgate-sdk",
            version=version,
            author=operator.user,
            tenant=operator.tenant,
            reason=reason,
            **fields,
        )
        self.backend.publish([event])
        return event

    def publish_policy(
        self, profile_yaml: str, policy_text: str, *, reason: str, session: str
    ) -> str:
        """Publish a catalog+policy version (an operator's); its version, the digest.
        ``policy_version_invalid`` when it does not parse: nothing is published."""
        operator = self._operator(session, "policy publish")
        check_text_field("profile and policy", profile_yaml + policy_text)  # one record
        from callgate.domain.policy_versions import content_of

        profile = content_of(profile_yaml, policy_text)
        if profile.digest not in self.policy_versions().published:
            self._policy_event(
                ev.PolicyPublished, operator, profile.digest, reason,
                profile_yaml=profile_yaml, policy_text=policy_text,
            )  # fmt: skip
        return profile.digest

    def activate_policy(self, version: str, *, reason: str, session: str) -> ev.Event:
        """Make a published version the active one on every decider, from this event's
        position in the log on (rolling back: an earlier version)."""
        operator = self._operator(session, "policy activate")
        self.policy_versions().require_published(version)
        return self._policy_event(ev.PolicyActivated, operator, version, reason)

    def shadow_policy(self, version: str | None, *, reason: str, session: str) -> ev.Event:
        """Decide every live call under ``version`` too (``None``: stop), never changing an
        outcome: a different decision is a ``ShadowDecisionDiffered``."""
        operator = self._operator(session, "policy shadow")
        if version is not None:
            self.policy_versions().require_published(version)
        return self._policy_event(ev.PolicyShadowSet, operator, version or "", reason)

    def policy_history(self, *, session: str) -> dict[str, Any]:
        """Every publish, activation and shadow change with who, when and why."""
        self._operator(session, "policy history")
        versions = self.policy_versions()
        return {
            "active": versions.active or None,
            "shadow": versions.shadow or None,
            "history": [entry.to_json() for entry in versions.history],
        }

    def shadow_report(self, *, session: str, version: str | None = None) -> dict[str, Any]:
        """The recorded disagreements of a shadow version (every one: ``version`` None)."""
        self._operator(session, "policy shadow report")
        found = [
            e for e in self.backend.read_events(only=ev.ShadowDecisionDiffered)
            if isinstance(e, ev.ShadowDecisionDiffered)
            and (version is None or e.candidate_version == version)
        ]  # fmt: skip
        counts: dict[str, int] = {}
        for e in found:
            transition = f"{e.active_outcome} → {e.candidate_outcome}"
            counts[transition] = counts.get(transition, 0) + 1
        return {
            "differed": len(found),
            "by_transition": dict(sorted(counts.items())),
            "differences": [
                {
                    "invocation_id": e.invocation_id,
                    "tool": e.tool,
                    "actor": e.actor,
                    "tenant": e.call_tenant,
                    "active_version": e.active_version,
                    "active_outcome": e.active_outcome,
                    "candidate_version": e.candidate_version,
                    "candidate_outcome": e.candidate_outcome,
                    "reason": e.reason,
                    "at": e.occurred_at,
                }
                for e in found
            ],
        }

    def freeze(
        self, scope: str, value: str, *, reason: str, session: str, lift: bool = False
    ) -> ev.FreezeApplied | ev.FreezeLifted:
        """Freeze (``lift``: unfreeze) every call of one tool, tenant or actor on every
        instance (ADR 0054): an operator's command (``operator_required`` otherwise), its
        fields checked before anything is published (``invalid_request``). The event is
        authored by the verified session; the deciders fold it and refuse ``frozen``."""
        from callgate.domain.freeze import FREEZE_KEY, checked_request

        operator = self._operator(session, "unfreeze" if lift else "freeze")
        checked_request(scope, value, reason, lifting=lift)
        kind: type[ev.FreezeApplied] | type[ev.FreezeLifted] = (
            ev.FreezeLifted if lift else ev.FreezeApplied
        )
        event_id = uuid.uuid4().hex
        event = kind(
            event_id=event_id,
            invocation_id=f"{FREEZE_KEY}-{event_id}",
            partition_key=FREEZE_KEY,
            correlation_id=event_id,
            occurred_at=self.app.clock(),
            producer="callgate-sdk",
            scope=scope,
            value=value,
            reason=reason,
            author=operator.user,
            tenant=operator.tenant,
        )
        self.backend.publish([event])
        return event

    def pins(self) -> Pins:
        """The pins and the definitions last seen, folded from the log (ADR 0066)."""
        from callgate.domain.pins import PIN_EVENTS
        from callgate.surfaces import pinning

        return pinning.fold(e for cls in PIN_EVENTS for e in self.backend.read_events(only=cls))

    def pin_tools(self, *, session: str, reason: str, tool: str | None = None) -> list[ev.Event]:
        """Pin every catalog tool of an MCP upstream (``tool``: that one) to the definition
        its upstream serves now: a ``ToolPinned`` each (an operator's command,
        ``operator_required`` otherwise). A tool that is not one, or whose upstream cannot
        be listed or no longer lists it, is refused and nothing is written."""
        from callgate.domain.freeze import checked_request
        from callgate.surfaces import pinning

        operator = self._operator(session, "catalog pin")
        checked_request("tool", tool or "all", reason, lifting=False)
        now = pinning.served(self.app.providers, only=tool)
        if tool is not None and tool not in now:
            raise Rejection(Code.UNKNOWN_TOOL, f"{tool} is not a tool of a reachable MCP upstream")
        if absent := sorted(t for t, d in now.items() if d == pinning.ABSENT):
            raise Rejection(Code.UNKNOWN_TOOL, f"the upstream no longer lists {absent}")
        at = self.app.clock()
        events = [
            pinning.pin_event(ev.ToolPinned, at, tool=t, digest=d, reason=reason,
                              author=operator.user, tenant=operator.tenant)
            for t, d in sorted(now.items())
        ]  # fmt: skip
        self.backend.publish(events)
        return events

    def record_definitions(self) -> list[ev.Event]:
        """The pinning watcher's check: a ``ToolDefinitionChanged`` for each pinned tool
        whose upstream now serves another definition than last recorded (ADR 0066)."""
        from callgate.surfaces import pinning

        now = pinning.served(self.app.providers)
        if not now:  # no pinnable tool reachable: the log is not read
            return []
        found = pinning.changes(self.app.profile, self.pins(), now, self.app.clock())
        if found:
            self.backend.publish(found)
        return found

    def audit_chains(self, session: str) -> list[dict[str, Any]]:
        """Every audit record of every chain, for an export: an operator's read only.

        A chain is exported whole or not at all (a gap would stop the export there), and a
        tenant's chain may hold a record no verified session owns, so a session without
        ``OPERATOR_ROLE`` is refused (``operator_required``) rather than given a partial one.
        """
        self._operator(session, "audit export")
        return [value for _, value in self.backend.view_items("audit")]

    def verify_audit(self, tenant: str | None = None) -> VerifyResult:
        """Check every per-partition hash chain against its head (detects a cut-off tail).

        With ``tenant``, only the chains holding that tenant's records (a partition key
        hashes the tenant, so those chains hold no other tenant's records).
        """
        from callgate_projections.audit import verify_chain

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


def _answered(decision: Mapping[str, Any]) -> bool:
    """The decider's answer to a decision; the grant that meets a quorum is answered by
    its ``granted`` record, which follows the ``recorded`` one (ADR 0030)."""
    if decision.get("decision") != "recorded":
        return True
    return int(decision.get("granted") or 0) < int(decision.get("required") or 0)


def is_final(status: Mapping[str, Any], continues: bool | None = None) -> bool:
    """Nothing more will happen to the invocation by itself (ADR 0029): settled, and not
    waiting on its approval (pending, or granted and continuing).

    ``continues``: whether the tool's calls continue once approved (the catalog's
    ``continue_on_approval``); when the caller knows it, a grant is not final until the
    call goes on (on Kafka the status can show the grant a step before that). Otherwise a
    grant is final unless the status already shows the invocation continuing.
    """
    if not status.get("settled"):
        return False
    if status.get("outcome") != Code.APPROVAL_REQUIRED.value:
        return True
    state = (status.get("approval") or {}).get("state")
    if state in (None, "pending"):
        return False  # pending, or its approval not shown in the status yet
    if state != "granted":
        return True
    if continues is not None:
        return not continues
    approved_by = status.get("approved_by") or {}
    return approved_by.get("approved_invocation_id") != status.get("invocation_id")


_DECIDED = {"denied": Code.APPROVAL_DENIED, "expired": Code.APPROVAL_EXPIRED}


def final_answer(invocation_id: str, status: Mapping[str, Any]) -> dict[str, Any]:
    """The ``propose`` answer, with a denied or expired approval as its own outcome."""
    out = _answer(invocation_id, status)
    out["final"] = is_final(status)
    approval = status.get("approval") or {}
    code = _DECIDED.get(str(approval.get("state")))
    if out["outcome"] == Code.APPROVAL_REQUIRED.value and code is not None:
        reason = f": {approval['reason']}" if approval.get("reason") else ""
        out["outcome"] = code.value
        out["error"] = {
            "code": code.value,
            "message": f"the approval was {approval['state']}{reason}",
            "details": {"approver": approval.get("approver")},
        }
    return out


def refusal(rejection: Rejection) -> dict[str, Any]:
    """The ``propose`` answer of a call refused before it was published: the same shape as
    a refusal the decider made (``outcome`` equals ``error.code``), with no invocation id,
    for nothing was published (docs/contract.md, "Command line")."""
    error: dict[str, Any] = {"code": rejection.code.value, "message": rejection.message}
    if rejection.details:
        error["details"] = dict(rejection.details)
    return {
        "invocation_id": None,
        "outcome": rejection.code.value,
        "error": error,
        "settled": True,
    }


def undecided(invocation_id: str) -> dict[str, Any]:
    """The answer and status of a call no decision is recorded for (yet): its own code,
    never ``allowed``, which says that a policy permitted the call."""
    return {
        "invocation_id": invocation_id,
        "outcome": Code.PENDING_DECISION.value,
        "settled": False,
        "error": {
            "code": Code.PENDING_DECISION.value,
            "message": "no decision is recorded for this call yet; it is neither permitted nor "
            f"refused: ask `callgate status {invocation_id}` or `callgate wait {invocation_id}`",
            "details": {},
        },
    }


def _answer(invocation_id: str, status: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``propose`` answer shape for an invocation, from its status value."""
    if status is None:
        return undecided(invocation_id)
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


def _route(
    session: str,
    key: str | None,
    approval_id: str | None,
    invocation_id: str,
    tenant: str | None = None,
) -> str:
    """The partition key: the decider re-derives it from the verified session (C8).
    ``tenant``: the verified session's, when the caller verified it (a claims mapping may
    take it from another claim than ``tenant``); else the token's unverified claim."""
    if key is not None:
        return partition_key(
            _unverified_tenant(session) if tenant is None else tenant, key, invocation_id
        )
    if approval_id is not None:
        # The approved invocation's partition; "" when the artifact names none, which is
        # where the decider expects it (and then refuses it as approval_missing).
        from callgate.domain.approvals import peek_partition_key

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


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
