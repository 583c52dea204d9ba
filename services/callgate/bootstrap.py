"""The composition root: the one place where adapters are wired to the pure core.

Settings are one frozen model built at the entry point (CLI, tests, bench) and
passed down; nothing here runs at import time, and the adapters and processes are
imported when first wired, so each command loads only what it uses.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from callgate.adapters.kafka.connection import Property, check_connection, use_connection
from callgate.config import (
    ApprovalSettings,
    ConfigError,
    NotifySettings,
    SessionSettings,
    SlackSettings,
    load_settings,
)
from callgate.state_dir import default_state_dir

if TYPE_CHECKING:
    # Imported where used: a command that needs only the keys (``session issue``) should
    # not pay for the policy engine, JSON Schema and the processes at start-up.
    from callgate.adapters.notify import Notifier, PendingReader, SlackInteractions
    from callgate.adapters.oidc import Discovery, OidcSignIn
    from callgate.config import ApprovalKeys
    from callgate.decider import Decider
    from callgate.domain.catalog import Profile
    from callgate.domain.identity import SessionIssuer, SessionVerifier
    from callgate.domain.keys import KeyRing
    from callgate.domain.policy import PolicyEngine
    from callgate.domain.process import Process
    from callgate.executor.process import Executor
    from callgate.providers.ledger import EffectLedger
    from callgate.providers.registry import ProviderRegistry

Clock = Callable[[], int]
# A setting has a value callgate cannot use (the command line reports it as misuse); the
# message names the file and key, the variable or the option (``callgate.config``).
SettingsError = ConfigError


def system_clock() -> int:
    """Wall-clock epoch milliseconds: the only clock; passed in everywhere else."""
    return time.time_ns() // 1_000_000


def default_instance_id() -> str:
    """The host name, made safe for Kafka ids: stable across restarts of this host's
    instance. Two instances on one host need ``--instance-id`` (serve refuses a second one
    with the same id and state directory)."""
    return re.sub(r"[^\w.-]", "-", os.uname().nodename) or "callgate"


class Settings(BaseModel):
    """Everything configurable, frozen (docs/contract.md "Command line" global options;
    the configuration file's keys: docs/configuration.md).

    Built at the entry point by ``from_env`` (file, ``CALLGATE_*``, options); a direct
    ``Settings(...)`` reads nothing from the environment, so tests get exactly what
    they pass.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=False)

    # The default is found, not assumed to be the current directory (``callgate.state_dir``).
    state_dir: Path = Field(default_factory=default_state_dir)
    backend: Literal["embedded", "kafka"] = "embedded"
    bootstrap_servers: str | None = None
    # librdkafka connection properties every Kafka client gets (TLS, SASL, socket): the
    # ``[kafka_client]`` table, ``CALLGATE_KAFKA_CLIENT`` as JSON. Nothing else: callgate's
    # delivery, isolation and transaction settings are not configurable (ADR 0013).
    kafka_client: dict[str, Property] = Field(default_factory=dict)
    profile: Path | None = None
    topic_prefix: str = "callgate"
    partitions: int = Field(default=6, ge=1)
    faults: dict[str, Any] = Field(default_factory=dict)
    # How long a command waits for an answer (a settled call, a broker): ``--timeout``.
    timeout_s: float = Field(default=30.0, gt=0)
    # Names one ``callgate serve`` on Kafka among those sharing the partitions: its
    # transactional ids and its state stores hang off it (ADR 0015). Stable across restarts
    # (the host name by default), unique among live instances.
    instance_id: str = Field(default_factory=default_instance_id, pattern=r"^[\w.-]+$")
    # Development mode: the development issuer (``callgate session issue``) is trusted and
    # may issue tokens. Off unless asked for (``--dev``, ``CALLGATE_DEV=1``): anyone who can
    # read the state directory could otherwise mint any identity (ADR 0013).
    dev: bool = False
    sessions: SessionSettings = SessionSettings()
    approvals: ApprovalSettings = ApprovalSettings()
    notify: NotifySettings = NotifySettings()
    slack: SlackSettings = SlackSettings()
    config_file: Path | None = None  # the file these settings were read from, if any
    # How long requests (which carry bearer session tokens) are kept once consumed: the
    # ``requests`` topic's ``retention.ms`` on Kafka, pruning on the embedded store.
    requests_retention_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=0)

    @field_validator("kafka_client")
    @classmethod
    def _connection_only(cls, value: dict[str, Property]) -> dict[str, Property]:
        check_connection(value)
        return value

    @classmethod
    def from_env(
        cls,
        config_file: Path | None = None,
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Settings:
        """Defaults < ``callgate.toml`` < ``CALLGATE_*`` variables < ``overrides`` (the
        command line's options; ``None`` means not given). Raises ``SettingsError``
        (``ConfigError``) naming the source of a value that is not usable."""
        return load_settings(cls, overrides, environ, config_file)


@dataclass
class App:
    """The wired application: the processes and the adapters they need."""

    settings: Settings
    clock: Clock

    @cached_property
    def profile(self) -> Profile:
        from callgate.domain.catalog import default_profile_path, load_profile

        return load_profile(self.settings.profile or default_profile_path())

    @cached_property
    def keys(self) -> KeyRing:
        from callgate.domain.keys import KeyRing

        return KeyRing.load_or_create(self.settings.state_dir)

    @cached_property
    def session_issuer(self) -> SessionIssuer:
        """The development issuer; only in development mode (production verifies the
        platform's tokens instead). Raises ``Rejection(DEVELOPMENT_MODE_REQUIRED)``."""
        from callgate.domain.codes import Code, Rejection
        from callgate.domain.identity import SessionIssuer

        if not self.settings.dev:
            raise Rejection(
                Code.DEVELOPMENT_MODE_REQUIRED,
                "development session tokens need development mode (--dev or CALLGATE_DEV=1);"
                " in production, sessions come from your identity provider",
            )
        return SessionIssuer(self.keys.session_signing_key, self.keys.session_kid)

    @cached_property
    def session_verifier(self) -> SessionVerifier:
        """The configured issuers, and the development issuer only in development mode
        (C6, ADR 0013). Raises ``ConfigError`` for an unusable issuer key."""
        from callgate.config import trusted_issuers
        from callgate.domain.identity import SessionVerifier

        trusted = trusted_issuers(self.settings, self.discovery.keys)
        if not self.settings.dev:
            return SessionVerifier.of_issuers(trusted)
        try:
            return SessionVerifier(self.keys.session_verification_keys(), trusted=trusted)
        except ValueError as exc:
            raise ConfigError(f"sessions.issuers: {exc}") from None

    @cached_property
    def discovery(self) -> Discovery:
        """The identity providers' discovery documents and keys (fetched when first used)."""
        from callgate.adapters.oidc import Discovery

        return Discovery()

    @cached_property
    def sign_in(self) -> list[OidcSignIn]:
        """The providers the console signs approvers in with (ADR 0031), in order."""
        from callgate.adapters.oidc import OidcSignIn

        return [
            OidcSignIn(i, entry, self.discovery)
            for i, entry in enumerate(self.settings.sessions.issuers)
            if entry.client_id is not None
        ]

    @cached_property
    def slack_interactions(self) -> SlackInteractions | None:
        """Slack's Approve/Deny clicks (``[slack]``), None when Slack is not configured."""
        from callgate.adapters.notify import SlackInteractions
        from callgate.config import SLACK_ISSUER, slack_issuer
        from callgate.domain.identity import SessionIssuer

        found = slack_issuer(self.settings)
        if found is None:
            return None
        kid, key = found
        issuer = SessionIssuer(key, kid, issuer=SLACK_ISSUER)
        return SlackInteractions(self.settings.slack, issuer, self.clock)

    def notifier(self, reader: PendingReader) -> Notifier | None:
        """Tells approvers of the pending view's changes (``[notify]``, ``[slack]``)."""
        from callgate.adapters.notify import build_notifier

        s = self.settings
        return build_notifier(reader, s.notify, s.slack, s.state_dir, self.clock)

    @cached_property
    def approval_keys(self) -> ApprovalKeys:
        """The active approval-signing key and every verifying key (C11; rotation)."""
        from callgate.config import approval_keys

        return approval_keys(self.settings, self.keys)

    @cached_property
    def policy(self) -> PolicyEngine:
        from callgate.domain.policy import PolicyEngine

        return PolicyEngine(self.profile)

    @cached_property
    def ledger(self) -> EffectLedger:
        from callgate.providers.ledger import EffectLedger

        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        return EffectLedger(self.settings.state_dir / "effects.sqlite")

    @cached_property
    def providers(self) -> ProviderRegistry:
        """The profile's ``providers:`` by kind (``ProfileError`` naming the key)."""
        from callgate.providers.registry import build_registry, default_context

        context = default_context(lambda: self.ledger, self.settings.faults, self.profile)
        return build_registry(self.profile, context)

    def decider(self) -> Decider:
        from callgate.decider import Decider, DeciderDeps
        from callgate.domain.approvals import ApprovalSigner, ApprovalVerifier

        return Decider(
            DeciderDeps(
                profile=self.profile,
                policy=self.policy,
                sessions=self.session_verifier,
                approval_signer=ApprovalSigner(
                    self.approval_keys.signing_key, self.approval_keys.signing_kid
                ),
                approval_verifier=ApprovalVerifier(self.approval_keys.verification_keys),
            )
        )

    def executor(self) -> Executor:
        from callgate.executor.process import Executor

        return Executor(self.profile, self.providers)

    def projections(self) -> list[Process[Any]]:
        from callgate_projections.audit import AuditProjection
        from callgate_projections.decisions import DecisionsProjection
        from callgate_projections.pending import PendingProjection
        from callgate_projections.status import StatusProjection

        return [StatusProjection(), PendingProjection(), AuditProjection(), DecisionsProjection()]

    def processes(self) -> list[Process[Any]]:
        """Every process `callgate serve` runs, in pipeline order."""
        return [self.decider(), self.executor(), *self.projections()]


def bootstrap(settings: Settings, clock: Clock = system_clock) -> App:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    use_connection(settings.kafka_client)
    return App(settings=settings, clock=clock)
