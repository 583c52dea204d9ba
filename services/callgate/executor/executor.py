"""The executor: the one process that talks to providers (the imperative shell).

It runs only what the decider requested on the authoritative ``events`` log; it
decides nothing about authority. Its bookkeeping (which executions started and
have not finished) is state folded from the log like any other process, so a
restarted executor knows what it must reconcile first (C12).

Sequence for an execution (the runner commits between the two halves):
1. ``handle(ExecutionRequested)`` records the execution as started and emits
   ``ExecutionStarted``; the runner commits it together with the input position.
2. ``follow_up`` runs after that commit: it calls ``provider.execute`` with the
   execution token and emits the outcome, committed in a second transaction.
A crash between 1 and 2 leaves a started-but-unfinished execution, which
``recover`` reconciles through ``provider.lookup`` before new work. Never a blind
second execution.

A request for a run that already finished is answered again with its recorded outcome
(the same event, byte for byte), never run again: the executor's rule "a run executes at
most once" does not rest on its input arriving once (``callgate.adapters.memory.Chaos``
delivers duplicates; a decider that requests a run again waits for that answer).

Dry-runs and lookups are read-only by contract, so they run inside ``handle``: a
crash before commit merely repeats them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import Any

from callgate.domain import events as ev
from callgate.domain.canonical import canonical_json, derive_id, sha256_hex, state_json
from callgate.domain.catalog import Profile, ProfileError
from callgate.domain.codes import Code, Rejection
from callgate.domain.policy_versions import profile_of
from callgate.domain.process_port import Output
from callgate.executor.descriptions import DESCRIPTION_TTL_MS, DescriptionCache
from callgate.providers.base import (
    INFRASTRUCTURE_ERRORS,
    Describes,
    Provider,
    ProviderError,
    ProviderTimeout,
    ResourceDescription,
    UpstreamRefused,
)
from callgate.providers.registry import ProviderRegistry
from callgate.providers.upstream_tokens import Acting, TokenExchangeFailed, acting_for

PRODUCER = "executor"


@dataclass(slots=True)
class Started:
    invocation_id: str
    partition_key: str
    tenant: str
    tool: str
    target: str
    args_json: str
    attempt: int
    # The ExecutionStarted event's id: the outcome of a recovery names it as its cause, so
    # the audit trail leads from the reconciliation to the execution it settles.
    started_event_id: str = ""
    policy_version: str = ""  # the version that decided it (ADR 0067)
    # Whom it acts for (``ExecutionRequested``): an upstream's token is obtained for them.
    actor: str = ""
    agent: str = ""
    delegation: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ExecutorState:
    started: dict[str, Started] = field(default_factory=dict)  # token -> open execution
    finished: list[str] = field(default_factory=list)  # "token#attempt" already run
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)  # run -> outcome event


_STATE_FIELDS = tuple(f.name for f in dataclass_fields(ExecutorState))
_STARTED_FIELDS = tuple(f.name for f in dataclass_fields(Started))


def dry_run_hash(snapshot_json: str) -> str:
    """The dry-run snapshot hash bound into approvals (C5, C11)."""
    return sha256_hex(snapshot_json)


class Executor:
    name = "executor"
    inputs = frozenset({"events"})
    recovers = True
    # What ``handle`` acts on (``process.reacts_to``); outcomes come from ``follow_up``.
    reacts_to: frozenset[type[ev.Event]] = frozenset(
        {
            ev.ExecutionRequested,
            ev.DryRunRequested,
            ev.ReconciliationRequested,
            ev.ResourceDescriptionRequested,
            ev.PolicyPublished,
        }
    )
    # Read whole beside the log (ADR 0064, 0067): every published version, so a call is
    # routed as the version that decided it describes the tool, whichever is active now.
    control_events: tuple[type[ev.Event], ...] = (ev.PolicyPublished,)
    control_keys: tuple[str, ...] = (ev.POLICY_KEY,)

    def __init__(
        self,
        profile: Profile,
        providers: ProviderRegistry,
        description_ttl_ms: int = DESCRIPTION_TTL_MS,
    ) -> None:
        self.profile = profile
        self.providers = providers
        # Published versions by digest (their content), and those built so far with the
        # providers as each routes its tools (ADR 0067).
        self._published: dict[str, ev.PolicyPublished] = {}
        self._routes: dict[str, tuple[Profile, ProviderRegistry]] = {}
        # Descriptions are cached for a bounded time (C7): a cache, not folded state,
        # because each answer is recorded as an event and replay reads that (ADR 0014).
        self.descriptions = DescriptionCache(description_ttl_ms)

    def seed(self, events: Sequence[ev.Event]) -> None:
        """Fold the published versions read beside the log (ADR 0067)."""
        for event in events:
            if isinstance(event, ev.PolicyPublished):
                self._published.setdefault(event.version, event)

    def _route(self, version: str) -> tuple[Profile, ProviderRegistry]:
        """The catalog and providers of ``version`` (the start profile's when it is that
        one, or empty: a request written before versions were named)."""
        if not version or version == self.profile.digest:
            return self.profile, self.providers
        route = self._routes.get(version)
        if route is None:
            published = self._published.get(version)
            if published is None:  # fail closed: never run a call as another version says
                raise ProviderError(f"policy version {version} is not known to the executor")
            try:
                profile = profile_of(published)
            except (Rejection, ProfileError) as err:
                raise ProviderError(f"policy version {version} does not load: {err}") from None
            route = (profile, self.providers.routing(profile))
            self._routes[version] = route
        return route

    def initial_state(self) -> ExecutorState:
        return ExecutorState()

    def dump_state(self, state: ExecutorState) -> bytes:
        # The same bytes as ``asdict``, built shallow: ``asdict`` deep-copies every value
        # and was a tenth of the executor's time on Kafka (docs/benchmarks.md).
        raw: dict[str, Any] = {name: getattr(state, name) for name in _STATE_FIELDS}
        raw["started"] = {
            token: {name: getattr(run, name) for name in _STARTED_FIELDS}
            for token, run in state.started.items()
        }
        return state_json(raw)

    def load_state(self, data: bytes) -> ExecutorState:
        return executor_state_from(json.loads(data))

    def next_due(self, state: ExecutorState) -> int | None:
        return None

    def due(self, state: ExecutorState, now_ms: int) -> tuple[ExecutorState, Sequence[Output]]:
        return state, ()

    def handle(
        self, state: ExecutorState, event: ev.Event, now_ms: int
    ) -> tuple[ExecutorState, Sequence[Output]]:
        if isinstance(event, ev.PolicyPublished):
            self.seed([event])
            return state, ()
        if isinstance(event, ev.ExecutionRequested):
            run = f"{event.execution_token}#{event.attempt}"
            if run in state.finished:  # never twice; answer a repeated request again
                answer = state.answers.get(run)
                return state, [] if answer is None else [_from_answer(answer)]
            if event.execution_token in state.started:
                return state, ()  # started: its outcome follows
            started = _follow(
                event,
                now_ms,
                ev.ExecutionStarted,
                execution_token=event.execution_token,
                attempt=event.attempt,
            )
            state.started[event.execution_token] = Started(
                event.invocation_id,
                event.partition_key,
                event.tenant,
                event.tool,
                event.target,
                event.args_json,
                event.attempt,
                started.event_id,
                event.policy_version,
                event.actor,
                event.agent,
                list(event.delegation),
            )
            return state, [started]
        if isinstance(event, ev.DryRunRequested):
            with acting_for(_acting(event.actor, event.tenant, event.agent, event.delegation)):
                return state, [self._dry_run(event, now_ms)]
        if isinstance(event, ev.ResourceDescriptionRequested):
            with acting_for(_acting(event.actor, event.tenant, event.agent, event.delegation)):
                return state, [self._describe(event, now_ms)]
        if isinstance(event, ev.ReconciliationRequested):
            who = _acting(event.actor, event.tenant, event.agent, event.delegation)
            with acting_for(who):
                lookup = self._lookup(
                    event,
                    event.execution_token,
                    event.original_invocation_id,
                    event.tool,
                    now_ms,
                    event.policy_version,
                )
            return state, [lookup]
        return state, ()

    def follow_up(
        self, state: ExecutorState, committed: Sequence[ev.Event], now_ms: int
    ) -> tuple[ExecutorState, Sequence[Output]]:
        outputs: list[Output] = []
        for started in committed:
            if not isinstance(started, ev.ExecutionStarted):
                continue
            run = state.started.pop(started.execution_token, None)
            if run is None:
                continue
            key = f"{started.execution_token}#{run.attempt}"
            state.finished.append(key)
            with acting_for(_acting(run.actor, run.tenant, run.agent, run.delegation)):
                outcome = self._execute(started, run, now_ms)
            outputs.append(_answered(state, key, outcome))
        return state, outputs

    def recover(self, state: ExecutorState, now_ms: int) -> tuple[ExecutorState, Sequence[Output]]:
        """C12: every started-but-unfinished execution is reconciled before new work."""
        outputs: list[Output] = []
        for token, run in sorted(state.started.items()):
            cause = ev.Event(
                event_id=run.started_event_id or derive_id("recover", token, str(run.attempt)),
                invocation_id=run.invocation_id,
                partition_key=run.partition_key,
                occurred_at=now_ms,
            )
            key = f"{token}#{run.attempt}"
            with acting_for(_acting(run.actor, run.tenant, run.agent, run.delegation)):
                lookup = self._lookup(
                    cause, token, run.invocation_id, run.tool, now_ms, run.policy_version
                )
            outputs.append(_answered(state, key, lookup))
            state.finished.append(key)
        state.started.clear()
        return state, outputs

    # -- provider calls ----------------------------------------------------------------

    def _provider(self, tool: str, version: str = "") -> Provider:
        profile, providers = self._route(version)
        spec = profile.tool(tool)
        if spec is None:
            raise ProviderError(f"tool {tool!r} is not in the catalog")
        try:
            return providers.get(spec.provider)
        except KeyError:
            raise ProviderError(f"no provider named {spec.provider!r}") from None

    def _dry_run(self, e: ev.DryRunRequested, now_ms: int) -> ev.Event:
        try:
            provider = self._provider(e.tool, e.policy_version)
            result = provider.dry_run(e.tool, e.target, _args(e.args_json), e.tenant)
            snapshot = canonical_json(result.snapshot)
        except TokenExchangeFailed as err:  # nothing was sent to the upstream
            return _follow(
                e, now_ms, ev.DryRunFailed, message=str(err), code=Code.TOKEN_EXCHANGE_FAILED.value
            )
        except (ProviderError, ProviderTimeout) as err:
            return _follow(e, now_ms, ev.DryRunFailed, message=str(err) or type(err).__name__)
        except INFRASTRUCTURE_ERRORS:
            raise
        except Exception as err:
            return _follow(e, now_ms, ev.DryRunFailed, message=_unusable(err))
        return _follow(
            e,
            now_ms,
            ev.DryRunRecorded,
            snapshot_json=snapshot,
            snapshot_hash=dry_run_hash(snapshot),
        )

    def _describe(self, e: ev.ResourceDescriptionRequested, now_ms: int) -> ev.Event:
        """Ask the target's system of record who owns it (read-only, like a dry-run).

        A provider that cannot describe, or cannot be reached, yields "nobody owns it",
        which the ACL denies (fail closed), with the reason in ``message``."""
        cached = self.descriptions.get(e.provider, e.target, now_ms)
        message = ""
        if cached is not None:
            found = cached
        else:
            try:
                provider = self.providers.get(e.provider)
            except KeyError:
                provider = None
            if not isinstance(provider, Describes):
                found = ResourceDescription(False, None, {})
                message = f"provider {e.provider!r} does not describe its resources"
            else:
                try:
                    found = provider.describe(e.tool, e.target)
                    canonical_json(found.attributes)  # what the decision will record
                    self.descriptions.put(e.provider, e.target, found, now_ms)
                except (ProviderError, ProviderTimeout) as err:
                    found = ResourceDescription(False, None, {})
                    message = f"provider {e.provider!r} could not describe it: {err}"
                except INFRASTRUCTURE_ERRORS:
                    raise
                except Exception as err:
                    found = ResourceDescription(False, None, {})
                    message = f"provider {e.provider!r} could not describe it: {_unusable(err)}"
        return _follow(
            e,
            now_ms,
            ev.ResourceDescribed,
            tool=e.tool,
            target=e.target,
            provider=e.provider,
            found=found.found and found.tenant is not None,
            owner=found.tenant,
            attributes_json=canonical_json(found.attributes),
            message=message,
        )

    def _execute(self, started: ev.ExecutionStarted, run: Started, now_ms: int) -> ev.Event:
        token = started.execution_token
        try:
            provider = self._provider(run.tool, run.policy_version)
            result = provider.execute(
                run.tool, run.target, _args(run.args_json), run.tenant, token, run.invocation_id
            )
            result_json = canonical_json(result.result)
        except ProviderTimeout as err:
            return _follow(
                started,
                now_ms,
                ev.ExecutionUncertain,
                execution_token=token,
                reason=str(err) or "timeout",
            )
        except ProviderError as err:  # nothing was applied
            return _follow(
                started,
                now_ms,
                ev.ExecutionFailed,
                execution_token=token,
                message=str(err),
                **_failure_fields(err),
            )
        except INFRASTRUCTURE_ERRORS:
            raise
        except Exception as err:
            return _follow(
                started, now_ms, ev.ExecutionUncertain, execution_token=token, reason=_unusable(err)
            )
        spec = self._route(run.policy_version)[0].tool(run.tool)
        if spec is None or spec.mutation:
            self.descriptions.forget(provider.name)  # an effect may change what it owns
        return _follow(
            started,
            now_ms,
            ev.ExecutionSucceeded,
            execution_token=token,
            result_json=result_json,
        )

    def _lookup(
        self,
        cause: ev.Event,
        token: str,
        original_invocation_id: str,
        tool: str,
        now_ms: int,
        version: str = "",
    ) -> ev.Event:
        try:
            found = self._provider(tool, version).lookup(token, tool)
            result_json = (
                canonical_json(found.result) if found.found and found.result is not None else ""
            )
        except (ProviderError, ProviderTimeout) as err:
            # Still unknown: stay uncertain rather than guess (fail closed).
            return _follow(
                cause, now_ms, ev.ExecutionUncertain, execution_token=token, reason=str(err)
            )
        except INFRASTRUCTURE_ERRORS:
            raise
        except Exception as err:
            return _follow(
                cause, now_ms, ev.ExecutionUncertain, execution_token=token, reason=_unusable(err)
            )
        return _follow(
            cause,
            now_ms,
            ev.ExecutionReconciled,
            execution_token=token,
            found=found.found,
            result_json=result_json,
            original_invocation_id=original_invocation_id,
        )


def _acting(user: str, tenant: str, agent: str, delegation: Sequence[str]) -> Acting | None:
    """Whom a request acts for; ``None`` for a record written before it said so."""
    return Acting(user, tenant, agent, tuple(delegation)) if user else None


def executor_state_from(raw: dict[str, Any]) -> ExecutorState:
    """The state ``Executor.dump_state`` wrote, parsed."""
    return ExecutorState(
        started={k: Started(**v) for k, v in raw["started"].items()},
        finished=list(raw["finished"]),
        answers=dict(raw.get("answers", {})),
    )


def _answered(state: ExecutorState, run: str, outcome: ev.Event) -> ev.Event:
    """Record ``outcome`` as the answer to ``run`` (see the module docstring)."""
    state.answers[run] = {"event_type": outcome.event_type, **outcome.to_dict()}
    return outcome


def _from_answer(answer: Mapping[str, Any]) -> ev.Event:
    fields = {k: v for k, v in answer.items() if k != "event_type"}
    return ev.event_from_dict(str(answer["event_type"]), fields)


def _unusable(err: Exception) -> str:
    """The reason recorded for a provider that raised what no provider may, or answered
    what canonical JSON cannot hold (bounded: it lands in an event)."""
    return f"provider answer unusable: {type(err).__name__}: {err}"[:500]


def _args(args_json: str) -> Mapping[str, Any]:
    value: dict[str, Any] = json.loads(args_json)
    return value


def _failure_fields(err: ProviderError) -> dict[str, Any]:
    """What an ``ExecutionFailed`` keeps of ``err`` beside its message: the code of a token
    exchange refused before anything was sent upstream (ADR 0081), or the upstream's own
    JSON-RPC error, kept for the agent (ADR 0085)."""
    if isinstance(err, TokenExchangeFailed):
        return {"code": Code.TOKEN_EXCHANGE_FAILED.value}
    if isinstance(err, UpstreamRefused):
        return {
            "upstream_code": err.code,
            "upstream_message": err.message,
            "upstream_data_json": err.data_json,
        }
    return {}


def _follow(cause: ev.Event, now_ms: int, cls: type[ev.Event], **fields: Any) -> ev.Event:
    return cls(
        event_id=derive_id(cause.event_id, cls.__name__),
        invocation_id=cause.invocation_id,
        partition_key=cause.partition_key,
        causation_id=cause.event_id,
        correlation_id=cause.correlation_id or cause.invocation_id,
        occurred_at=now_ms,
        producer=PRODUCER,
        **fields,
    )
