"""The authenticated session principal (C6): the only source of actor, tenant and roles.

Identity rules (docs/contract.md, "Identity normalization", ADR 0023):

- **Canonical at the boundary.** A session's ``sub``, ``tenant`` and roles must already be
  in canonical form (``canonical_problem``) or the token is ``unauthenticated``; nothing
  is rewritten, so the principal carries exactly what the identity provider signed.
- **Exact to grant.** Every comparison that grants (tenant ownership, roles, approver
  roles, tenant scope of reads, approval bindings, partition routing) is ``==``. Case
  and compatibility forms are significant: ``ACME`` is another tenant than ``acme``.
- **Folding only denies.** ``fold_identity`` (NFKC, case folding, UTS #39 confusable
  skeleton) is used only to refuse more: the actor under a look-alike spelling cannot
  approve their own call, and free text naming a look-alike of another principal is
  flagged. Nothing is ever allowed because two spellings fold together.
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # ICU (PyICU) is imported by the functions that check or fold an identifier: a process
    # that verifies no session (``callgate propose`` of a running server) does not load it.
    import icu


@dataclass(frozen=True, slots=True)
class Principal:
    user: str
    tenant: str
    roles: tuple[str, ...]
    session_id: str = ""
    expires_at: int = 0  # epoch milliseconds
    # The client the token names as acting for ``user`` (``azp``, else ``client_id``): the
    # agent. Empty when the token names none. Canonical like the other claims; a policy
    # reads it as ``principal.agent``.
    agent: str = ""
    # Who acts for ``user``, the current actor first (the token's RFC 8693 ``act`` claim:
    # the outermost ``act`` is the current actor, each nested one the actor before it).
    # Subjects only, each canonical; empty when the token carries no ``act``.
    delegation: tuple[str, ...] = ()

    def has_any_role(self, roles: tuple[str, ...] | frozenset[str]) -> bool:
        """Exact membership: ``Admin`` is not ``admin`` (docs/contract.md)."""
        return any(role in self.roles for role in roles)


def canonical_problem(value: str) -> str | None:
    """Why ``value`` is not a canonical identifier, or ``None`` when it is.

    Canonical: non-empty, NFC, no surrounding white space, no control, format, surrogate,
    private-use, unassigned or default-ignorable code point (U+200B, U+2060, U+00AD,
    U+FEFF, ...). Such text has one spelling per rendering a reader can tell apart, which
    is what makes exact comparison safe.
    """
    import icu

    # Code points that render as nothing (or are formatting only): the Unicode property
    # Default_Ignorable_Code_Point, which ``unicodedata`` does not expose, read from ICU.
    ignorable = icu.UProperty.DEFAULT_IGNORABLE_CODE_POINT
    if not value:
        return "is empty"
    if value != value.strip():
        return "has surrounding white space"
    if not unicodedata.is_normalized("NFC", value):
        return "is not in Unicode normalization form NFC"
    for ch in value:
        category = unicodedata.category(ch)
        if category in ("Cc", "Cf", "Cs", "Co", "Cn") or icu.Char.hasBinaryProperty(ch, ignorable):
            return f"contains the invisible or control code point U+{ord(ch):04X}"
    return None


@functools.cache
def _spoof_checker() -> icu.SpoofChecker:
    import icu

    return icu.SpoofChecker()


@functools.lru_cache(maxsize=16384)
def fold_identity(value: str) -> str:
    """The broad form two spellings are compared in, only ever to deny.

    NFKC, case folding and NFKC again (a fixed point), surrounding white space and
    default-ignorable code points removed, then the UTS #39 confusable skeleton (ICU's
    SpoofChecker): ``ACME``, full-width ``acme``, ``acme `` and the Cyrillic ``асме`` all fold to
    the skeleton of ``acme``.
    """
    import icu

    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", value).casefold())
    ignorable = icu.UProperty.DEFAULT_IGNORABLE_CODE_POINT
    visible = "".join(ch for ch in folded if not icu.Char.hasBinaryProperty(ch, ignorable)).strip()
    try:
        skeleton = str(_spoof_checker().getSkeleton(0, visible))
    except icu.ICUError:  # text ICU cannot take (a lone surrogate): compare it as it is
        skeleton = visible
    # The skeleton maps to look-alike prototypes that are not always lower case.
    return unicodedata.normalize("NFKC", skeleton.casefold())


def looks_alike(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` fold together (``fold_identity``): a reason to refuse, never
    to allow."""
    return fold_identity(a) == fold_identity(b)
