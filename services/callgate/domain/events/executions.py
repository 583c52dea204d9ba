"""The execution events on the ``events`` topic: what the decider asks the executor to run,
reconcile or serve again, and what the executor records of each call (dry runs, starts,
outcomes, uncertain calls and their reconciliation).
"""

from __future__ import annotations

from callgate.domain.events.envelope import Event, event_class


@event_class
class ExecutionRequested(Event):
    tenant: str
    tool: str
    target: str
    args_json: str
    execution_token: str  # passed through to the provider as its idempotency token
    attempt: int = 1
    # The catalog+policy version that decided the call (ADR 0067): the executor routes
    # the tool as that version describes it. Empty in records written before it.
    policy_version: str = ""
    # Whom the call acts for, from the verified session (issue 38.5): the executor obtains
    # the upstream's token for this user (``providers.upstream_tokens``). Empty in records
    # written before.
    actor: str = ""
    # The verified session's agent and delegation chain, beside the user (issue 38.4):
    # ``Principal.agent`` and ``Principal.delegation``; empty in records written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


@event_class
class ReconciliationRequested(Event):
    """C12: before any retry, ask the provider what happened to ``execution_token``."""

    tenant: str
    tool: str
    target: str
    args_json: str
    execution_token: str
    original_invocation_id: str
    # The catalog+policy version that decided the call (ADR 0067): the executor routes
    # the tool as that version describes it. Empty in records written before it.
    policy_version: str = ""
    # Whom the call acts for, from the verified session (issue 38.5): the executor obtains
    # the upstream's token for this user (``providers.upstream_tokens``). Empty in records
    # written before.
    actor: str = ""
    # The verified session's agent and delegation chain, beside the user (issue 38.4):
    # ``Principal.agent`` and ``Principal.delegation``; empty in records written before.
    agent: str = ""
    delegation: tuple[str, ...] = ()


@event_class
class ReplayServed(Event):
    """C8: an idempotency key replayed the stored result of the original authorized call."""

    original_invocation_id: str
    original_outcome: str
    result_json: str


@event_class
class ReplayAwaited(Event):
    """C8: a call under an idempotency key waits for the key's original call to settle; it
    is then served that call's outcome (``ReplayServed``) or fails with it."""

    original_invocation_id: str


@event_class
class DryRunRecorded(Event):
    snapshot_json: str
    snapshot_hash: str


@event_class
class DryRunFailed(Event):
    message: str
    code: str = ""  # as ``ExecutionFailed.code``


@event_class
class ExecutionStarted(Event):
    """Written before the provider is called, so a crash leaves a trace to reconcile."""

    execution_token: str
    attempt: int


@event_class
class ExecutionSucceeded(Event):
    execution_token: str
    result_json: str


@event_class
class ExecutionFailed(Event):
    execution_token: str
    message: str
    # The outcome when it is not ``execution_failed``: ``token_exchange_failed`` when the
    # upstream's token could not be obtained (nothing was sent). Empty: execution_failed.
    code: str = ""
    # The upstream's JSON-RPC error, when it answered with one (released v10): its code,
    # message and data (canonical JSON, empty when it sent none or too much), which the
    # agent is answered with. None and empty in other failures and in records before.
    upstream_code: int | None = None
    upstream_message: str = ""
    upstream_data_json: str = ""


@event_class
class ExecutionUncertain(Event):
    """C12: the provider timed out or the executor crashed; the effect may or may not exist."""

    execution_token: str
    reason: str


@event_class
class ExecutionReconciled(Event):
    """C12: the provider's ``lookup`` told what happened to ``execution_token``."""

    execution_token: str
    found: bool
    result_json: str = ""
    original_invocation_id: str = ""
