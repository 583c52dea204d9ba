"""The authenticated session principal (C6): the only source of actor, tenant and roles."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    tenant: str
    roles: tuple[str, ...]
    session_id: str = ""
    expires_at: int = 0  # epoch milliseconds

    def has_any_role(self, roles: tuple[str, ...] | frozenset[str]) -> bool:
        return any(r in self.roles for r in roles)
