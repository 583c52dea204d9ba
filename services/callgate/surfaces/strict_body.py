"""The one strict JSON reader (``callgate.domain.limits.parse_json``) in front of the HTTP
API and the MCP server: every request body is read by it before any framework parser.

FastAPI (pydantic) and the MCP SDK keep the last of two duplicate keys. A proxy or WAF that
keeps the first would see another request than callgate decides (a parser differential),
so a body with duplicate keys (equal after unescaping), ``NaN``/``Infinity``, a lone
surrogate, an out-of-range number or nesting past ``ENVELOPE_MAX_DEPTH`` is refused here,
before anything is published. What passes reads the same in every conforming parser.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from callgate.domain.codes import Code, Rejection
from callgate.domain.limits import MAX_RECORD_BYTES, parse_json

# An envelope (HTTP body, JSON-RPC message) around the arguments: the arguments' own depth
# limit (the profile's ``entry_limits.max_depth``) is applied again by the SDK.
ENVELOPE_MAX_DEPTH = 64
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
JSONRPC_PARSE_ERROR = -32700

Refusal = Callable[[Rejection, bytes], ASGIApp]


def check_body(body: bytes | str, max_bytes: int = MAX_RECORD_BYTES) -> Rejection | None:
    """``None`` when ``body`` passes the strict reader, else the coded refusal
    (``invalid_request``, ``details.limit`` as the limits name it)."""
    try:
        parse_json(body, max_bytes, ENVELOPE_MAX_DEPTH)
    except Rejection as r:
        message = r.message.replace("arguments", "request body", 1)
        return Rejection(Code.INVALID_REQUEST, message, r.details)
    return None


def read_form(data: bytes, max_fields: int, encoding: str = "utf-8") -> dict[str, str]:
    """A form or query string read strictly: ``encoding`` (``ascii`` for a query), every
    percent-escape UTF-8, every field ``name=value``, at most ``max_fields``, none twice
    (which one would the sender have meant?). Raises ``ValueError`` saying why."""
    pairs = parse_qsl(
        data.decode(encoding),  # UnicodeDecodeError is a ValueError
        keep_blank_values=True,
        strict_parsing=True,
        errors="strict",
        max_num_fields=max_fields,
    )
    fields: dict[str, str] = {}
    for name, value in pairs:
        if name in fields:
            raise ValueError(f"the field {name!r} repeats")
        fields[name] = value
    return fields


class StrictJsonBody:
    """ASGI middleware: buffers a request body (its size is bounded by the body limit
    outside it), reads it strictly, and answers ``refuse(rejection, body)`` or passes the
    very same bytes on."""

    def __init__(self, app: ASGIApp, refuse: Refusal, max_bytes: int = MAX_RECORD_BYTES) -> None:
        self.app = app
        self.refuse = refuse
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body and not _form_encoded(scope):
            refused = check_body(body, self.max_bytes)
            if refused is not None:
                await self.refuse(refused, body)(scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _form_encoded(scope: Scope) -> bool:
    """A form body (Slack's interaction requests): not JSON, so not this reader's; the route
    that takes it reads the JSON inside it with ``parse_json`` itself."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-type":
            return bool(
                value.split(b";")[0].strip().lower() == b"application/x-www-form-urlencoded"
            )
    return False


def jsonrpc_id(body: bytes | str) -> str | int | None:
    """The id of a refused JSON-RPC request, so that its error reaches the waiting caller;
    read leniently and used only to address the error, never to decide anything."""
    try:
        value = json.loads(body)
    except (ValueError, TypeError, RecursionError):
        return None
    found = value.get("id") if isinstance(value, dict) else None
    return found if isinstance(found, str | int) and not isinstance(found, bool) else None


def jsonrpc_refusal(rejection: Rejection, body: bytes | str) -> dict[str, Any]:
    """The JSON-RPC error answering a message the strict reader refused: ``data`` carries
    callgate's code and the limit, as every other refusal does."""
    return {
        "jsonrpc": "2.0",
        "id": jsonrpc_id(body),
        "error": {
            "code": JSONRPC_PARSE_ERROR,
            "message": rejection.message,
            "data": {"code": rejection.code.value, **rejection.details},
        },
    }
