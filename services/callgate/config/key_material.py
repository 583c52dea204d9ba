"""The keys the configuration names: trusted issuers' public keys, the Slack issuer's and
the approval signing key. Read at start, so a missing or bad key file fails there, named by
its configuration key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from callgate.config import ConfigError
from callgate.config.sections import ApprovalSettings, IssuerSettings, SlackSettings

if TYPE_CHECKING:
    from callgate.domain.identity import KeySet, TrustedIssuer
    from callgate.domain.keys import KeyRing, PrivateKey, PublicKey


def _where(settings: Any, key: str) -> str:
    source = settings.config_file
    return f"configuration {source}: key '{key}'" if source else f"setting '{key}'"


def _public_keys(
    settings: Any, key: str, jwks_file: Path | None, pem_files: Mapping[str, Path]
) -> dict[str, PublicKey]:
    from callgate.adapters.keyfiles import KeyFileError, load_jwks, load_public_key

    keys: dict[str, PublicKey] = {}
    try:
        if jwks_file is not None:
            keys.update(load_jwks(jwks_file))
        for kid, pem in pem_files.items():
            if kid in keys:
                raise KeyFileError(f"kid {kid!r} is in the JWKS file and in pem_files")
            keys[kid] = load_public_key(pem)
    except KeyFileError as exc:
        raise ConfigError(f"{_where(settings, key)}: {exc}") from None
    return keys


# An issuer's keys that rotate (``jwks_uri`` or its discovery document's), already
# fetched once; an adapter (``callgate.adapters.jwks``) given by the composition root.
# Raises ``OSError`` or ``ValueError`` naming what failed.
KeySets = Callable[[IssuerSettings], "KeySet"]


def trusted_issuers(settings: Any, key_sets: KeySets | None = None) -> list[TrustedIssuer]:
    """The configured session issuers (C6) with their keys (from their key files, or from
    ``key_sets`` for keys fetched over HTTP), claims mappings and bindings (ADR 0078)."""
    from callgate.domain.claims import Binding
    from callgate.domain.identity import TrustedIssuer
    from callgate.domain.keys import algorithm_of
    from callgate.domain.scope import OPERATOR_ROLE

    out: list[TrustedIssuer] = []
    owner: dict[str, str] = {}
    several = len(settings.sessions.issuers) > 1
    for i, entry in enumerate(settings.sessions.issuers):
        key = f"sessions.issuers[{i}]"
        if several and entry.tenants is None and entry.tenant is None:
            raise ConfigError(
                f"{_where(settings, key + '.tenants')}: missing: with more than one issuer,"
                " each names the tenants it may assert (tenants, or one tenant)"
            )
        keys = _public_keys(settings, key, entry.jwks_file, entry.pem_files)
        key_set: KeySet | None = None
        if entry.rotating_keys:
            if key_sets is None:
                raise ConfigError(f"{_where(settings, key)}: its keys need fetching")
            try:
                key_set = key_sets(entry)
            except (OSError, ValueError) as exc:
                where = _where(settings, key + ".algorithms" if "allowed" in str(exc) else key)
                raise ConfigError(f"{where}: keys: {exc}") from None
            keys = dict(key_set.current())
        if not keys:
            raise ConfigError(
                f"{_where(settings, key)}: names no key (jwks_file, pem_files, jwks_uri or"
                " discovery = true)"
            )
        for kid, public in keys.items():
            if algorithm_of(public) not in entry.algorithms:
                allowed = ", ".join(entry.algorithms)
                raise ConfigError(
                    f"{_where(settings, key + '.algorithms')}: key {kid!r} is "
                    f"{algorithm_of(public)}, not among the allowed ({allowed})"
                )
            if kid in owner:
                raise ConfigError(
                    f"{_where(settings, key)}: kid {kid!r} also belongs to issuer {owner[kid]!r}"
                )
            owner[kid] = entry.issuer
        out.append(
            TrustedIssuer(
                entry.issuer,
                entry.audience,
                {} if key_set is not None else keys,
                entry.algorithms,
                entry.clock_skew_s * 1000,
                claims=entry.claims_mapping(),
                binding=entry.binding(),
                key_set=key_set,
            )
        )
    slack = slack_issuer(settings)
    if slack is not None:
        kid, private = slack
        if kid in owner:
            raise ConfigError(
                f"{_where(settings, 'slack.session_kid')}: kid {kid!r} also belongs to"
                f" issuer {owner[kid]!r}"
            )
        alg = algorithm_of(private.public_key())
        # Slack sessions are minted by callgate for the mapped users: bound to exactly
        # their tenants and roles.
        users = settings.slack.users
        roles = frozenset(r for u in users for r in u.roles)
        binding = Binding(frozenset(u.tenant for u in users), roles, OPERATOR_ROLE in roles)
        out.append(
            TrustedIssuer(
                SLACK_ISSUER, "callgate", {kid: private.public_key()}, (alg,), binding=binding
            )
        )
    return out


SLACK_ISSUER = "callgate-slack"


def slack_issuer(settings: Any) -> tuple[str, PrivateKey] | None:
    """The kid and private key that sign mapped Slack users' session tokens, if Slack is
    configured (``[slack]``)."""
    from callgate.adapters.keyfiles import KeyFileError, load_private_key

    conf: SlackSettings = settings.slack
    if not conf.configured:
        return None
    assert conf.session_kid is not None and conf.session_key_file is not None
    try:
        return conf.session_kid, load_private_key(conf.session_key_file)
    except KeyFileError as exc:
        raise ConfigError(f"{_where(settings, 'slack.session_key_file')}: {exc}") from None


@dataclass(frozen=True)
class ApprovalKeys:
    """The active signing key and every verifying key, by kid."""

    signing_kid: str
    signing_key: PrivateKey
    verification_keys: Mapping[str, PublicKey]


def approval_keys(settings: Any, state_keys: KeyRing) -> ApprovalKeys:
    """From ``approvals`` when configured (shared by every instance), else the state
    directory's key (one instance only)."""
    conf: ApprovalSettings = settings.approvals
    if not conf.configured:
        return ApprovalKeys(
            state_keys.approval_kid,
            state_keys.approval_signing_key,
            state_keys.approval_verification_keys(),
        )
    from callgate.adapters.keyfiles import KeyFileError, load_private_key

    if not conf.signing_kid or conf.signing_key_file is None:
        missing = "approvals.signing_kid" if not conf.signing_kid else "approvals.signing_key_file"
        raise ConfigError(f"{_where(settings, missing)}: missing (the active signing key)")
    try:
        private = load_private_key(conf.signing_key_file)
    except KeyFileError as exc:
        raise ConfigError(f"{_where(settings, 'approvals.signing_key_file')}: {exc}") from None
    verifying = _public_keys(settings, "approvals", conf.jwks_file, conf.pem_files)
    public = private.public_key()
    listed = verifying.get(conf.signing_kid)
    if listed is not None and _raw(listed) != _raw(public):
        raise ConfigError(
            f"{_where(settings, 'approvals.signing_kid')}: {conf.signing_kid!r} names another"
            " public key in the verification keys than the signing key file holds"
        )
    verifying[conf.signing_kid] = public
    return ApprovalKeys(conf.signing_kid, private, verifying)


def _raw(key: PublicKey) -> bytes:
    from callgate.adapters.keyfiles import public_pem

    return public_pem(key)
