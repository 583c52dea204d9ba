"""A stand-in identity provider for tests: its keys come from ``callgate keys generate``
(PEM private keys and a JWKS of the public ones); it signs session tokens the way a
platform's issuer would (docs/reference/configuration.md ``[[sessions.issuers]]``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import jwt

from callgate.adapters.keyfiles import jwks_file, load_private_key
from callgate.domain.keys import algorithm_of

ISSUER = "https://idp.test.example"


@dataclass(frozen=True)
class IdentityProvider:
    keys: Path
    issuer: str = ISSUER
    audience: str = "callgate"

    @property
    def jwks(self) -> Path:
        return jwks_file(self.keys, "session")

    def token(
        self,
        kid: str,
        user: str,
        tenant: str,
        *roles: str,
        now_ms: int | None = None,
        ttl_s: int = 3600,
    ) -> str:
        """A session token signed with the key ``kid`` (``<keys>/<kid>.pem``)."""
        key = load_private_key(self.keys / f"{kid}.pem")
        iat = (time.time_ns() // 1_000_000 if now_ms is None else now_ms) // 1000
        claims = {
            "sub": user,
            "tenant": tenant,
            "roles": list(roles),
            "iat": iat,
            "exp": iat + ttl_s,
            "iss": self.issuer,
            "aud": self.audience,
        }
        return jwt.encode(claims, key, algorithm=algorithm_of(key), headers={"kid": kid})

    def config(
        self,
        algorithms: tuple[str, ...],
        approval_keys: Path,
        signing_kid: str,
        operators: bool = True,
    ) -> str:
        """``callgate.toml`` text trusting this provider, with shared approval keys. It is
        the platform's own provider: it may grant the operator role unless told not to."""
        algs = ", ".join(f'"{a}"' for a in algorithms)
        return (
            "[[sessions.issuers]]\n"
            f'issuer = "{self.issuer}"\n'
            f'audience = "{self.audience}"\n'
            f'jwks_file = "{self.jwks}"\n'
            f"algorithms = [{algs}]\n"
            "clock_skew_s = 5\n"
            f"operators = {str(operators).lower()}\n"
            "[approvals]\n"
            f'signing_kid = "{signing_kid}"\n'
            f'signing_key_file = "{approval_keys / f"{signing_kid}.pem"}"\n'
            f'jwks_file = "{jwks_file(approval_keys, "approval")}"\n'
        )
