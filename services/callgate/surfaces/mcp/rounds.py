"""Approvals that resume inside MCP 2026-07-28: multi round-trip requests (ADR 0065).

A 2026-07-28 client cannot be sent a server request during a call, so a held call cannot
ask the user to open the approval page, and a long-held request is fragile. Such a client
gets an ``input_required`` result instead. The result carries a ``requestState`` that
names the invocation, and, on the first round and when the client takes URL elicitations,
an elicitation of the console page for it. The client's SDK retries the same
``tools/call`` with that state. Each retry waits one round for the invocation's final
outcome, and answers it, or ``input_required`` again while the approval is pending. Past
the configured hold, the answer is the usual ``approval_required`` tool error, which says
how to resume.

The state is sealed by the MCP SDK's ``RequestStateBoundary``: AES-GCM under a key kept
in the state directory, bound to the method, the tool, the arguments' digest, callgate's
audience and the session's principal, with an expiry. A tampered, expired or replayed
state, or one sent by another principal, is refused before callgate reads it (JSON-RPC
``-32602``, ``data.reason`` ``invalid_request_state``). Inside, the gateway still checks
that the session may see the invocation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp.types as types
from mcp.server import ServerRequestContext
from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity

from callgate.domain.limits import parse_document
from callgate.domain.principal import Principal

# The first revision with multi round-trip requests (no server requests during a call).
MRTR_SINCE = "2026-07-28"
AUDIENCE = "callgate"
APPROVAL_INPUT = "callgate/approval"
# The SDK client retries at most 10 rounds by default: a hold is cut into fewer rounds, so
# that such a client reaches the end of the hold and its answer.
ROUNDS_PER_HOLD = 8
MIN_ROUND_S = 1.0


def speaks_rounds(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether the client is on a revision where a call pauses with ``input_required``."""
    return ctx.session.protocol_version >= MRTR_SINCE


def boundary(
    key: bytes, hold_s: float, principal_of: Callable[[ServerRequestContext[Any, Any]], Principal]
) -> RequestStateBoundary:
    """The SDK's sealing middleware, bound to callgate's principal of the session.

    A session that does not verify raises in ``principal_of``: the boundary fails closed.
    """

    def bound(ctx: ServerRequestContext[Any, Any]) -> str:
        principal = principal_of(ctx)
        return json.dumps([principal.tenant, principal.user])

    security = RequestStateSecurity(
        keys=[key], ttl=max(hold_s, 1.0) + 300.0, bind_principal=bound, audience=AUDIENCE
    )
    return RequestStateBoundary(security, default_audience=AUDIENCE)


@dataclass(frozen=True)
class Round:
    """What a ``requestState`` holds (sealed): the invocation, when its hold began, and
    whether the round carries the upstream's requests (``asks``, ADR 0075) rather than
    waiting for an approval."""

    invocation_id: str
    since_ms: int
    asks: bool = False

    def dump(self) -> str:
        return json.dumps(
            {"invocation_id": self.invocation_id, "since_ms": self.since_ms, "asks": self.asks}
        )

    @staticmethod
    def load(text: str) -> Round:
        """Only the boundary's own plaintext reaches here; a shape it never minted is a
        bug, refused as such rather than guessed at."""
        data = parse_document(text)  # the strict reader: ValueError, never RecursionError
        if not (
            isinstance(data, dict)
            and isinstance(data.get("invocation_id"), str)
            and type(data.get("since_ms")) is int  # not a bool
            and isinstance(data.get("asks", False), bool)
        ):
            raise ValueError("a requestState callgate did not mint")
        return Round(data["invocation_id"], data["since_ms"], data.get("asks", False))


def round_s(hold_s: float) -> float:
    return max(MIN_ROUND_S, hold_s / ROUNDS_PER_HOLD)


def paused(
    ctx: ServerRequestContext[Any, Any],
    state: Round,
    approve_at: str,
    *,
    ask: bool,
    meta: Mapping[str, Any],
) -> types.InputRequiredResult:
    """The ``input_required`` result of a call waiting for its approval: the state, and on
    the first round (``ask``) the approval page as a URL elicitation when the client
    takes them and the page is a URL."""
    requests: dict[str, Any] = {}
    caps = ctx.session.client_capabilities
    takes_urls = caps is not None and caps.elicitation is not None and caps.elicitation.url
    if ask and takes_urls and approve_at.startswith(("https://", "http://")):
        requests[APPROVAL_INPUT] = {
            "method": "elicitation/create",
            "params": {
                "mode": "url",
                "message": f"Approve {state.invocation_id} in the callgate console",
                "url": approve_at,
            },
        }
    return types.InputRequiredResult.model_validate(
        {
            **({"inputRequests": requests} if requests else {}),
            "requestState": state.dump(),
            "_meta": dict(meta),
        }
    )
