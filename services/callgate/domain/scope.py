"""Tenant scope of identifiers and reads (docs/contract.md, "Tenant scope of identifiers").

Identifiers a client chooses can never address another tenant's invocation, approval or key:

- **Request ids are bound to the session.** The invocation id of a proposal and the event
  id of an approval decision (the keys of the ``status``, ``pending`` and ``decisions``
  views) have the form ``<nonce>.<binding>``, where ``binding`` is a hash of the session
  token and the nonce. The token is a bearer secret, so only its holder can form an id
  bound to it, and an id formed for one session is never valid with another (of any
  tenant). The decider refuses an unbound id before anything else: the request is
  dead-lettered (``malformed_event``) and never answered under that id, which may be
  someone else's. The SDK and the command line form these ids themselves.
- **Idempotency keys are scoped by the verified tenant.** A key's state lives under the
  partition key ``k-<hash(tenant, key)>``: the same key in two tenants is two
  keys (``canonical.partition_key``), and a call routed to another tenant's key partition
  is refused as misrouted (``malformed_event``).
- **Approval ids** are signed artifacts binding the tenant (C11): another tenant's
  approval is ``approval_mismatch``; approving another tenant's invocation is
  ``approver_forbidden``.
- **Reads** (``status``, ``audit``, ``pending``) take a session and show only its tenant;
  a session holding ``OPERATOR_ROLE`` reads every tenant.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib

from callgate.domain.principal import Principal

OPERATOR_ROLE = "callgate-operator"
# A policy enforcement point: may ask AuthZEN evaluations for its tenant's sessions (ADR 0083).
PEP_ROLE = "callgate-pep"
BINDING_CHARS = 32  # 128 bits of SHA-256
_SEPARATOR = "."
MAX_NONCE_CHARS = 128


def _binding(session_token: str, nonce: str) -> str:
    data = f"callgate-request-id\x00{session_token}\x00{nonce}".encode("utf-8", "replace")
    return hashlib.sha256(data).hexdigest()[:BINDING_CHARS]


def bound_id(session_token: str, nonce: str) -> str:
    """A request id bound to ``session_token``: ``<nonce>.<binding>``."""
    if not nonce or _SEPARATOR in nonce or len(nonce) > MAX_NONCE_CHARS:
        raise ValueError("a nonce is 1-128 characters without '.'")
    return f"{nonce}{_SEPARATOR}{_binding(session_token, nonce)}"


def is_bound(request_id: str, session_token: str) -> bool:
    """Whether ``request_id`` was formed by ``bound_id`` for this very session token."""
    nonce, sep, binding = request_id.rpartition(_SEPARATOR)
    if not sep or not nonce or len(nonce) > MAX_NONCE_CHARS:
        return False
    return binding == _binding(session_token, nonce)


def may_read(reader: Principal, tenant: object) -> bool:
    """Whether ``reader`` may see a record of ``tenant`` (None: a record no verified session
    owns, such as an unauthenticated proposal's rejection: operators only). Exact: ``ACME``
    reads nothing of ``acme``."""
    if reader.has_any_role((OPERATOR_ROLE,)):
        return True
    return isinstance(tenant, str) and bool(tenant) and tenant == reader.tenant
