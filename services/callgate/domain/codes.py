"""The outcome and error vocabulary (docs/contract.md, "Vocabulary").

One code, one meaning, everywhere: events, CLI, SDK and docs use these spellings.
Outcome codes are what a decision can end with; command errors are what a command
can fail with before or around a decision (they never appear in an event).
"""

from __future__ import annotations

import errno
import sqlite3
from enum import StrEnum
from typing import Any


class Code(StrEnum):
    ALLOWED = "allowed"
    EXECUTED = "executed"
    REPLAYED = "replayed"
    APPROVAL_REQUIRED = "approval_required"
    TOOL_FORBIDDEN = "tool_forbidden"
    IDENTITY_SPOOF = "identity_spoof"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    UNAUTHENTICATED = "unauthenticated"
    APPROVAL_MISSING = "approval_missing"
    APPROVAL_EXPIRED = "approval_expired"
    APPROVAL_MISMATCH = "approval_mismatch"
    APPROVAL_DENIED = "approval_denied"
    APPROVAL_CONSUMED = "approval_consumed"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    EXECUTION_FAILED = "execution_failed"
    OUTCOME_UNCERTAIN = "outcome_uncertain"
    MALFORMED_EVENT = "malformed_event"
    # Added codes (docs/contract.md allows additions where users need them):
    # an approver who may not decide on this invocation (role missing, or the actor themself).
    APPROVER_FORBIDDEN = "approver_forbidden"
    # the invocation asked about (approve/deny/status) does not exist or is not pending.
    NOT_PENDING = "not_pending"
    # the tool requires a dry-run (C5) and its provider has none to offer (an MCP upstream
    # whose catalog entry names no dry_run_tool): refused before anything runs.
    DRY_RUN_UNAVAILABLE = "dry_run_unavailable"
    # what the request or command asked for does not exist: an invocation (or an HTTP
    # route), one of another tenant, or (Kafka) the deployment's topics, which
    # `callgate serve` creates.
    NOT_FOUND = "not_found"
    # the HTTP request is malformed: not JSON, a missing or mistyped field, a bad parameter.
    INVALID_REQUEST = "invalid_request"
    # the request body exceeds the server's limit.
    PAYLOAD_TOO_LARGE = "payload_too_large"
    # the client sent more requests than the server's rate limit allows; retry later.
    RATE_LIMITED = "rate_limited"
    # the answer did not arrive within the bounded wait (`--timeout`; the server's for HTTP).
    TIMEOUT = "timeout"
    # another `callgate serve` holds this state directory.
    BUSY = "busy"
    # no Kafka broker answered at the bootstrap servers within the timeout.
    BROKER_UNAVAILABLE = "broker_unavailable"
    # the state directory's disk refused a write (full, a file-size limit, an I/O error:
    # ADR 0084): nothing of the request was recorded; retry once the disk has space.
    STORAGE_UNAVAILABLE = "storage_unavailable"
    # the command line or a setting was used wrongly (exit 2); nothing was published.
    USAGE = "usage"
    # an unexpected failure inside callgate; the message names no internals over HTTP.
    INTERNAL_ERROR = "internal_error"
    # a development-only operation (``session issue``) asked of a process not in development mode.
    DEVELOPMENT_MODE_REQUIRED = "development_mode_required"
    # an operator's command (``policy simulate``) asked by a session without the operator role.
    OPERATOR_REQUIRED = "operator_required"
    # a state-changing HTTP request authenticated by the console's session cookie came
    # without the matching X-CSRF-Token header: refused before anything runs.
    CSRF_FAILED = "csrf_failed"
    # ``policy publish``: the catalog or the Cedar policy does not parse (nothing published).
    POLICY_VERSION_INVALID = "policy_version_invalid"
    # ``policy activate``/``shadow``: no version of that digest was published.
    POLICY_VERSION_UNKNOWN = "policy_version_unknown"
    # an operator froze the call's tool, tenant or actor (``callgate freeze``): refused on
    # every instance, a continuation of an approval granted before the freeze included.
    FROZEN = "frozen"
    # the call was published and no decision has been seen yet (the deciders are behind, or
    # cannot reach the broker): neither permitted nor refused; ask its status or wait on it.
    # Never ``allowed``, which says that a policy permitted the call.
    PENDING_DECISION = "pending_decision"
    # the upstream serves a pinned tool with another definition than its pin (ADR 0066):
    # refused on every instance until an operator pins it again (``callgate catalog pin``).
    TOOL_DEFINITION_CHANGED = "tool_definition_changed"
    # a usage limit of the profile (``limits:``) would be exceeded by the call (ADR 0079):
    # refused before anything runs; the details name the limit, the window, the usage and
    # ``retry_after_s``, the time until the call fits.
    LIMIT_EXCEEDED = "limit_exceeded"
    # the provider's upstream takes a token obtained for the call (token exchange for the
    # user, or client credentials: ADR 0081) and its authorization server did not issue
    # one: refused before anything was sent to the upstream, so nothing was applied.
    TOKEN_EXCHANGE_FAILED = "token_exchange_failed"
    # an evaluation only (AuthZEN, ADR 0083): the policy permits the call and it needs no
    # confirmation. Nothing ran; no call will.
    PERMITTED = "permitted"
    # an AuthZEN evaluation asked by a session without the PEP role (ADR 0083).
    PEP_REQUIRED = "pep_required"


# Outcomes after which an invocation will not change by itself.
TERMINAL: frozenset[Code] = frozenset(
    {
        Code.EXECUTED,
        Code.REPLAYED,
        Code.APPROVAL_REQUIRED,
        Code.TOOL_FORBIDDEN,
        Code.IDENTITY_SPOOF,
        Code.INVALID_ARGUMENTS,
        Code.UNKNOWN_TOOL,
        Code.UNAUTHENTICATED,
        Code.APPROVAL_MISSING,
        Code.APPROVAL_EXPIRED,
        Code.APPROVAL_MISMATCH,
        Code.APPROVAL_DENIED,
        Code.APPROVAL_CONSUMED,
        Code.IDEMPOTENCY_CONFLICT,
        Code.EXECUTION_FAILED,
        Code.OUTCOME_UNCERTAIN,
        Code.MALFORMED_EVENT,
        Code.DRY_RUN_UNAVAILABLE,
        Code.FROZEN,
        Code.TOOL_DEFINITION_CHANGED,
        Code.LIMIT_EXCEEDED,
        Code.TOKEN_EXCHANGE_FAILED,
        Code.PERMITTED,
    }
)


def failure_code(code: str) -> Code:
    """The outcome of a failed execution or dry-run (``ExecutionFailed.code``): the code
    it names, or ``execution_failed`` for none or one that is not a failure's (a failure
    stays a failure whatever a record says)."""
    exchange = code == Code.TOKEN_EXCHANGE_FAILED
    return Code.TOKEN_EXCHANGE_FAILED if exchange else Code.EXECUTION_FAILED


def evaluation_outcome(permitted: bool, confirmation: str) -> Code:
    """The outcome of an evaluation only (ADR 0083), from its policy decision: ``permitted``
    only when the call would go ahead without a person; a call that needs a confirmation is
    ``approval_required`` (its evaluation answers false: nothing was confirmed)."""
    if not permitted:
        return Code.TOOL_FORBIDDEN
    return Code.PERMITTED if confirmation == "none" else Code.APPROVAL_REQUIRED


# Codes a command fails with; never an invocation's outcome.
COMMAND_ERRORS: frozenset[Code] = frozenset(
    {
        Code.NOT_FOUND,
        Code.INVALID_REQUEST,
        Code.PAYLOAD_TOO_LARGE,
        Code.RATE_LIMITED,
        Code.TIMEOUT,
        Code.BUSY,
        Code.BROKER_UNAVAILABLE,
        Code.STORAGE_UNAVAILABLE,
        Code.DEVELOPMENT_MODE_REQUIRED,
        Code.CSRF_FAILED,
        Code.USAGE,
        Code.INTERNAL_ERROR,
        Code.POLICY_VERSION_INVALID,
        Code.POLICY_VERSION_UNKNOWN,
        Code.PEP_REQUIRED,
    }
)


class Rejection(Exception):
    """A coded rejection raised by pure checks; the decider turns it into an event."""

    def __init__(self, code: Code, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details or {}


class Unanswerable(Rejection):
    """A request that may not be answered under its own ids (an invocation id not bound to
    its session: docs/contract.md, "Tenant scope of identifiers"). Runners dead-letter it
    (``callgate.adapters.failures``) and give no answer under ids that may be another's."""


# Failures of the machinery under a provider (sockets, disk, the simulated providers'
# SQLite ledger): the runner retries the input (``callgate.adapters.failures``). Any other
# exception out of a provider, or an answer that canonical JSON cannot hold (NaN, a number
# past 2^53, nesting past the limits), is the provider misbehaving: the executor answers it
# like a failure of that call (``callgate.executor.executor``), never by retrying forever.
INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    sqlite3.OperationalError,
    MemoryError,
)


# What a disk that cannot take a write looks like (ADR 0084). SQLite answers SQLITE_FULL
# for ENOSPC and an SQLITE_IOERR for the other write errors: EFBIG past the kernel's
# file-size limit (RLIMIT_FSIZE), EDQUOT past a quota, EIO from the device.
_STORAGE_SQLITE = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR})
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO, errno.EROFS})


def storage_failure(exc: BaseException) -> str | None:
    """Why the disk refused a write, when ``exc`` is such a refusal (``storage_unavailable``:
    running again once it has space succeeds); ``None`` for anything else."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in _STORAGE_SQLITE:
            return f"{exc.sqlite_errorname}: {exc}"
        return None
    if isinstance(exc, OSError) and exc.errno in _STORAGE_ERRNOS:
        return f"{errno.errorcode[exc.errno]}: {exc.strerror or 'refused'}"
    return None
