"""Sessions from the development issuer, for examples, tests and local runs.

Production sessions come from an identity provider; the development issuer (``dev``
settings) signs tokens with the local key, which a deployment does not trust.
"""

from __future__ import annotations

from collections.abc import Sequence

from callgate.application.base import UseCases


class Sessions(UseCases):
    """Dev sessions."""

    def issue_session(
        self, user: str, tenant: str, roles: Sequence[str], ttl_seconds: int = 3600
    ) -> str:
        """A session token of ``user`` in ``tenant`` with ``roles``, signed by the
        development issuer (trusted only with ``dev`` settings)."""
        issuer = self.app.session_issuer
        return issuer.issue(user, tenant, list(roles), self.app.clock(), ttl_seconds)
