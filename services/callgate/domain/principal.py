"""The authenticated session principal (C6): the only source of actor, tenant and roles.

Also the one normalization of identity (docs/contract.md, "Identity normalization") that
every comparison of two users, tenants or roles goes through.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    tenant: str
    roles: tuple[str, ...]
    session_id: str = ""
    expires_at: int = 0  # epoch milliseconds

    def has_any_role(self, roles: tuple[str, ...] | frozenset[str]) -> bool:
        """Roles compare in their normalized form (docs/contract.md, "Identity
        normalization"); a verified principal's roles are normalized already."""
        mine = {normalize_identity(r) for r in self.roles}
        return any(normalize_identity(r) in mine for r in roles)


def normalize_identity(value: str) -> str:
    """The form two identity spellings are compared in: NFKC, casefolded, stripped.

    Full-width, upper-case and padded variants of "alice" equal "alice"; look-alikes
    from other scripts (a Cyrillic "a", U+0430) stay different, so they are reported as a spoof.
    NFKC is applied again after casefolding (casefolding can leave text NFKC would change),
    so that the result is a fixed point: normalizing twice equals normalizing once.
    """
    folded = unicodedata.normalize("NFKC", value).casefold()
    return unicodedata.normalize("NFKC", folded).strip()


def same_identity(a: str, b: str) -> bool:
    """Whether two spellings name the same user, tenant or role (``normalize_identity``)."""
    return normalize_identity(a) == normalize_identity(b)
