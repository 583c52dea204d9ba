"""``callgate config check``: the effective configuration, secrets redacted.

By the time this runs the entry point has loaded everything the configuration names
(profile, issuer keys, approval keys), so a view means the configuration is usable. The
view says where each kind of trust comes from; it never shows key material.
"""

from __future__ import annotations

from typing import Any

from callgate.config.redaction import redacted
from callgate.domain.keys import algorithm_of
from callgate.surfaces.ports import Surface


def effective_configuration(app: Surface) -> dict[str, Any]:
    settings = app.settings
    trusted = [
        {
            "issuer": t.issuer,
            "audience": t.audience,
            "algorithms": list(t.algorithms),
            "clock_skew_s": t.leeway_ms // 1000,
            "kids": sorted(t.current_keys()),
        }
        for t in app.trusted_issuers
    ]
    keys = app.approval_keys
    return {
        "ok": True,
        "config_file": str(settings.config_file) if settings.config_file else None,
        "development_mode": settings.dev,
        "session_issuers": trusted,
        "development_issuer": (
            {"issuer": "callgate-dev", "kid": app.keys.session_kid} if settings.dev else None
        ),
        "approvals": {
            "source": "configuration" if settings.approvals.configured else "state directory",
            "signing_kid": keys.signing_kid,
            "signing_alg": algorithm_of(keys.signing_key),
            "verification_kids": sorted(keys.verification_keys),
        },
        "profile": {
            "file": str(app.profile.source),
            "policy_version": app.profile.digest,
            "tools": sorted(app.profile.tools),
        },
        "settings": redacted(settings.model_dump(mode="json")),
    }
