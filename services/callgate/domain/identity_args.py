"""Identity fields in a call's arguments (C6): each must name the session's own user or
tenant, exactly. Apart from the session token's checks (``identity``) because it reads the
arguments, not the token: the verified ``Principal`` is all it needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from callgate.domain.codes import Code, Rejection
from callgate.domain.identity import MAX_CLAIM_CHARS
from callgate.domain.principal import Principal, fold_identity, looks_alike

MAX_ARGS_DEPTH = 64  # deeper arguments are refused rather than walked


def check_identity(
    spec_identity_args: tuple[str, ...],
    tenant_fields: tuple[str, ...],
    args: Mapping[str, Any],
    principal: Principal,
) -> dict[str, Any]:
    """C6: every identity field anywhere in ``args`` must name the session's user/tenant.

    Walks dicts and lists at any depth. A key that is, or folds to (``fold_identity``),
    one of ``spec_identity_args`` names the acting user; one of ``tenant_fields`` names a
    tenant. Its value must equal the session's identifier exactly: any other value,
    another spelling of it included, raises ``Rejection(IDENTITY_SPOOF, ...,
    {"field": "dotted.path"})``. Any other string that is not a session identifier but
    folds together with one (``ALICE``, full-width ``alice``, a Cyrillic look-alike) is refused
    the same way, with ``details.reason`` ``look-alike``: folding only ever denies.
    Returns a copy of ``args``.
    """
    user_keys = frozenset(fold_identity(k) for k in spec_identity_args)
    tenant_keys = frozenset(fold_identity(k) for k in tenant_fields)
    mine = (principal.user, principal.tenant)
    result: dict[str, Any] = _Walk(user_keys, tenant_keys, principal, mine).walk(args, "", 0)
    return result


@dataclass(frozen=True, slots=True)
class _Walk:
    """One call's walk of its arguments. A class, not a nested function: a closure that
    calls itself is a reference cycle, which only the collector frees, and callgate's
    processes collect rarely (ADR 0021), so one per call held memory (the soak's RSS)."""

    user_keys: frozenset[str]
    tenant_keys: frozenset[str]
    principal: Principal
    mine: tuple[str, str]  # the session's user and tenant

    def walk(self, value: Any, path: str, depth: int) -> Any:
        if depth > MAX_ARGS_DEPTH:
            raise Rejection(Code.INVALID_ARGUMENTS, "arguments nested too deeply", {"field": path})
        principal = self.principal
        if isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                item_path = f"{path}.{key}" if path else str(key)
                name = fold_identity(key) if isinstance(key, str) else None
                if name in self.user_keys:
                    out[key] = _expect(item, principal.user, "user", item_path)
                elif name in self.tenant_keys:
                    out[key] = _expect(item, principal.tenant, "tenant", item_path)
                else:
                    out[key] = self.walk(item, item_path, depth + 1)
            return out
        if isinstance(value, list | tuple):
            return [
                self.walk(item, f"{path}.{i}" if path else str(i), depth + 1)
                for i, item in enumerate(value)
            ]
        mine = self.mine
        if isinstance(value, str) and value not in mine and len(value) <= MAX_CLAIM_CHARS:
            for who in mine:
                if looks_alike(value, who):
                    raise Rejection(
                        Code.IDENTITY_SPOOF,
                        f"argument {path!r} names a look-alike of the session's identity",
                        {"field": path, "reason": "look-alike"},
                    )
        return value


def _expect(value: Any, session_value: str, kind: str, path: str) -> str:
    if not isinstance(value, str) or value != session_value:
        raise Rejection(
            Code.IDENTITY_SPOOF,
            f"argument {path!r} names a {kind} other than the session's",
            {"field": path},
        )
    return session_value
