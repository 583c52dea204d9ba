"""The one mapping of vocabulary codes to HTTP statuses, and the handlers that apply it.

Every error response is ``{"error": {"code", "message"}}`` with ``code`` from the
vocabulary (``domain/codes.py``); no handler lets a stack trace or an exception's text
out (an unexpected failure is ``500 internal_error`` with a fixed message and is logged
on the server). ``POST /v1/proposals`` answers a decided proposal with the
``callgate propose --json`` answer and the status of its outcome from the same table
(``200`` for ``executed``, ``403`` for ``tool_forbidden``, ...); that answer carries
``error: {code, message}`` exactly when the outcome is a refusal (ADR 0017).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from callgate.domain.codes import Code, Rejection, storage_failure

log = logging.getLogger("callgate.http")

# The documented table (docs/reference/http-api.md, ADR 0017). Outcome codes of a call that ran or
# is waiting for a human are not errors and answer 200.
STATUS: Mapping[Code, int] = MappingProxyType(
    {
        Code.ALLOWED: 200,
        Code.EXECUTED: 200,
        Code.REPLAYED: 200,
        Code.APPROVAL_REQUIRED: 200,
        Code.PERMITTED: 200,  # an evaluation only (AuthZEN, ADR 0083)
        Code.PENDING_DECISION: 202,  # published, not decided yet: ask its Location
        Code.INVALID_REQUEST: 422,
        Code.INVALID_ARGUMENTS: 422,
        Code.MALFORMED_EVENT: 422,
        Code.UNAUTHENTICATED: 401,
        Code.TOOL_FORBIDDEN: 403,
        Code.IDENTITY_SPOOF: 403,
        Code.APPROVER_FORBIDDEN: 403,
        Code.DEVELOPMENT_MODE_REQUIRED: 403,
        Code.OPERATOR_REQUIRED: 403,
        Code.PEP_REQUIRED: 403,  # an AuthZEN evaluation by a session that is no PEP
        Code.CSRF_FAILED: 403,
        Code.FROZEN: 403,
        Code.NOT_FOUND: 404,
        Code.UNKNOWN_TOOL: 404,
        Code.NOT_PENDING: 409,
        Code.TOOL_DEFINITION_CHANGED: 409,
        Code.APPROVAL_MISSING: 409,
        Code.APPROVAL_EXPIRED: 409,
        Code.APPROVAL_MISMATCH: 409,
        Code.APPROVAL_DENIED: 409,
        Code.APPROVAL_CONSUMED: 409,
        Code.IDEMPOTENCY_CONFLICT: 409,
        Code.DRY_RUN_UNAVAILABLE: 409,
        Code.PAYLOAD_TOO_LARGE: 413,
        Code.RATE_LIMITED: 429,
        Code.LIMIT_EXCEEDED: 429,  # with Retry-After (``retry_after``), ADR 0079
        Code.EXECUTION_FAILED: 502,
        Code.TOKEN_EXCHANGE_FAILED: 502,  # the upstream's authorization server refused
        Code.OUTCOME_UNCERTAIN: 502,
        Code.INTERNAL_ERROR: 500,
        Code.TIMEOUT: 504,
        # Command errors of the command line; a server meets broker_unavailable (its Kafka
        # brokers stopped answering) and storage_unavailable (the disk under its state
        # directory refused a write, ADR 0084), but every code has its status.
        Code.USAGE: 400,
        Code.BUSY: 503,
        Code.BROKER_UNAVAILABLE: 503,
        Code.STORAGE_UNAVAILABLE: 503,
        # Policy versions (ADR 0050): command line only so far.
        Code.POLICY_VERSION_INVALID: 422,
        Code.POLICY_VERSION_UNKNOWN: 404,
    }
)


class ApiError(Exception):
    """A coded refusal of the HTTP surface itself (not found, too large, rate limited)."""

    def __init__(self, code: Code, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


class Problem(Exception):
    """A refusal the ARAP profile names (ADR 0090): ``application/problem+json`` with the
    profile's problem ``type`` and status, and callgate's vocabulary ``code`` beside it."""

    def __init__(self, problem: tuple[str, int], code: Code, detail: str) -> None:
        super().__init__(f"{problem[0]}: {detail}")
        self.type, self.status = problem
        self.code = code
        self.detail = detail


def retry_after(answer: Mapping[str, object]) -> dict[str, str]:
    """``Retry-After`` for a call refused by a usage limit: the seconds until it fits
    (``details.retry_after_s``); none when it never fits on its own (ADR 0079)."""
    error = answer.get("error")
    details = error.get("details") if isinstance(error, Mapping) else None
    seconds = details.get("retry_after_s") if isinstance(details, Mapping) else None
    if answer.get("outcome") != Code.LIMIT_EXCEEDED.value or not isinstance(seconds, int):
        return {}
    return {"Retry-After": str(seconds)}


def error_body(code: Code, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code.value, "message": message}}


# The AuthZEN Authorization API (ADR 0083) answers a request it cannot read with
# "400 Bad Request" (its section "Error Responses"); the body is callgate's coded error.
AUTHZEN_PREFIX = "/access/"


def error_response(
    code: Code, message: str, headers: Mapping[str, str] | None = None, status: int | None = None
) -> JSONResponse:
    return JSONResponse(
        error_body(code, message), status_code=status or STATUS[code], headers=headers
    )


def request_status(path: str, code: Code) -> int:
    """The status of ``code`` on ``path``: ``invalid_request`` is ``400`` on AuthZEN's
    routes, as that specification requires, and ``422`` elsewhere."""
    if code is Code.INVALID_REQUEST and path.startswith(AUTHZEN_PREFIX):
        return 400
    return STATUS[code]


def _rejection(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Rejection)
    status = request_status(request.url.path, exc.code)
    return error_response(exc.code, exc.message, status=status)


def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.code, exc.message, exc.headers)


def _problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    body = {
        "type": exc.type,
        "title": exc.type.rsplit(":", 1)[-1].replace("_", " "),
        "status": exc.status,
        "detail": exc.detail,
        "code": exc.code.value,
    }
    return JSONResponse(body, status_code=exc.status, media_type="application/problem+json")


def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = []
    for err in exc.errors()[:5]:
        where = ".".join(str(part) for part in err.get("loc", ()))
        problems.append(f"{where}: {err.get('msg', 'invalid')}")
    status = request_status(request.url.path, Code.INVALID_REQUEST)
    message = "; ".join(problems) or "invalid request"
    return error_response(Code.INVALID_REQUEST, message, status=status)


def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        return error_response(Code.NOT_FOUND, f"no such resource: {request.url.path}")
    if exc.status_code == 413:
        return error_response(Code.PAYLOAD_TOO_LARGE, "request body too large")
    if exc.status_code == 405:
        body = error_body(Code.INVALID_REQUEST, "method not allowed")
        return JSONResponse(body, status_code=405, headers=dict(exc.headers or {}))
    # Anything else Starlette or FastAPI refuses (e.g. a body that is not UTF-8).
    return error_response(Code.INVALID_REQUEST, "the request could not be read")


def _timeout(request: Request, exc: Exception) -> JSONResponse:
    return error_response(Code.TIMEOUT, "no answer within the server's wait; ask again later")


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    reason = storage_failure(exc)
    if reason is not None:  # the disk refused a write: retry later (ADR 0084)
        log.warning("%s %s: the disk refused a write: %s", request.method, request.url.path, reason)
        return error_response(Code.STORAGE_UNAVAILABLE, "the server's disk refused a write")
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(Code.INTERNAL_ERROR, "internal error (logged on the server)")


def install(app: FastAPI) -> None:
    """Register the handlers: the only place a code becomes an HTTP status."""
    app.add_exception_handler(Rejection, _rejection)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(Problem, _problem)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(TimeoutError, _timeout)
    app.add_exception_handler(Exception, _unexpected)
