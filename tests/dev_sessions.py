"""Development session tokens for tests that run callgate as a subprocess: minted in the
test's process from the deployment's settings, with the issuer and key that
``callgate session issue`` would use, without a command start-up per token."""

from __future__ import annotations

from collections.abc import Sequence

from callgate.bootstrap import Settings, bootstrap


def dev_token(
    settings: Settings, user: str, tenant: str, roles: Sequence[str], ttl_seconds: int = 3600
) -> str:
    """A development session token of ``settings``' deployment."""
    app = bootstrap(settings)
    return app.session_issuer.issue(user, tenant, list(roles), app.clock(), ttl_seconds)
