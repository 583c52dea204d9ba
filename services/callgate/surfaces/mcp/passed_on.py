"""An upstream's JSON-RPC error, passed on to the agent as it is.

A call the upstream answered with a JSON-RPC error settles as ``execution_failed``; its
status keeps that error (``error.details.upstream_error``: code, message, data). The agent
is answered with the same JSON-RPC error, not with a tool result: a client then tells an
upstream's ``-32602`` or ``-32021`` from a tool that ran and failed, as it would talking to
the upstream directly. The SDK's transport gives the error the HTTP status the negotiated
revision requires (2026-07-28: 400 for ``-32021``, ``-32602`` and the other request
errors, 404 for ``-32601``; 2025-11-25: 200). callgate's own refusals keep their form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcp.shared.exceptions import MCPError

from callgate.domain.codes import Code


def passed_on(answer: Mapping[str, Any]) -> MCPError | None:
    """The upstream's JSON-RPC error ``answer`` failed with, else None."""
    if answer.get("outcome") != Code.EXECUTION_FAILED.value:
        return None
    details = (answer.get("error") or {}).get("details") or {}
    upstream = details.get("upstream_error")
    if not isinstance(upstream, Mapping) or not isinstance(upstream.get("code"), int):
        return None
    return MCPError(upstream["code"], str(upstream.get("message", "")), upstream.get("data"))
