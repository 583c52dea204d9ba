"""Where a request goes: its partition key, which the decider re-derives from the verified
session and refuses when misrouted (C8)."""

from __future__ import annotations

import json

from callgate.domain.canonical import partition_key


def route(
    session: str,
    key: str | None,
    approval_id: str | None,
    invocation_id: str,
    tenant: str | None = None,
) -> str:
    """The partition key: the decider re-derives it from the verified session (C8).
    ``tenant``: the verified session's, when the caller verified it (a claims mapping may
    take it from another claim than ``tenant``); else the token's unverified claim."""
    from callgate.domain.approvals import peek_partition_key

    if key is not None:
        return partition_key(
            _unverified_tenant(session) if tenant is None else tenant, key, invocation_id
        )
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
