"""The composition root: the one place where adapters are wired to the pure core.

Settings are one frozen model built at the entry point (CLI, tests, bench) and
passed down; nothing here runs at import time, and the adapters and processes are
imported when first wired, so each command loads only what it uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from callgate.config import ConfigError
from callgate.settings import (
    Clock,
    Settings,
    SettingsError,
    default_instance_id,
    system_clock,
)

__all__ = [
    "App",
    "Clock",
    "Settings",
    "SettingsError",
    "bootstrap",
    "default_instance_id",
    "system_clock",
]

if TYPE_CHECKING:
    # Imported where used: a command that needs only the keys (``session issue``) should
    # not pay for the policy engine, JSON Schema and the processes at start-up.
    from callgate.adapters.avro_codec import AvroCodec
    from callgate.adapters.embedded.backend import EmbeddedBackend
    from callgate.adapters.embedded.runner import EmbeddedRunner
    from callgate.adapters.embedded.store import EmbeddedStore
    from callgate.adapters.jwks import RotatingKeys
    from callgate.adapters.kafka.backend import KafkaBackend
    from callgate.adapters.kafka.live import LiveKafkaBackend
    from callgate.adapters.kafka.runner import KafkaRunner
    from callgate.adapters.notify.notifier import Notifier
    from callgate.adapters.notify.reader import PendingReader
    from callgate.adapters.notify.slack import SlackInteractions
    from callgate.adapters.oidc import Discovery, OidcSignIn
    from callgate.application.client import Gateway
    from callgate.application.ports import Backend
    from callgate.config.key_material import ApprovalKeys
    from callgate.config.sections import IssuerSettings
    from callgate.decider import Decider
    from callgate.domain.catalog import Profile
    from callgate.domain.events import Event
    from callgate.domain.identity import SessionIssuer, SessionVerifier, TrustedIssuer
    from callgate.domain.keys import KeyRing
    from callgate.domain.policy import PolicyEngine
    from callgate.domain.process_port import Process
    from callgate.domain.redaction import Redactor
    from callgate.executor.executor import Executor
    from callgate.executor.invocations import Invocations
    from callgate.providers.channels import Channels
    from callgate.providers.ledger import EffectLedger
    from callgate.providers.metrics import ProviderMetrics
    from callgate.providers.registry import ProviderRegistry
    from callgate.tracing import Tracing


@dataclass
class App:
    """The wired application: the processes and the adapters they need."""

    settings: Settings
    clock: Clock

    @cached_property
    def profile(self) -> Profile:
        from callgate.adapters.profiles import load_profile
        from callgate.domain.catalog import default_profile_path

        return load_profile(self.settings.profile or default_profile_path())

    @cached_property
    def keys(self) -> KeyRing:
        from callgate.adapters.keyfiles import load_or_create_keyring

        return load_or_create_keyring(self.settings.state_dir)

    @cached_property
    def request_state_key(self) -> bytes:
        """The key sealing MCP ``requestState`` (ADR 0065), kept in the state directory."""
        from callgate.adapters.keyfiles import request_state_key

        return request_state_key(self.settings.state_dir)

    @cached_property
    def redactor(self) -> Redactor:
        """Digests in place of the catalog's sensitive fields (ADR 0035); no key is read or
        created while no tool has one."""
        from callgate.adapters.keyfiles import redaction_key
        from callgate.domain.redaction import NO_REDACTION, redactor_for

        paths = self.profile.sensitive_paths()
        if not paths:
            return NO_REDACTION
        return redactor_for(redaction_key(self.settings.state_dir), paths)

    @cached_property
    def tracing(self) -> Tracing | None:
        """OpenTelemetry traces (``[tracing]``, ADR 0036): the SDK's tracer provider with
        an OTLP exporter, only when enabled; ``None`` (no provider, no span) when off."""
        conf = self.settings.tracing
        if not conf.enabled:
            return None
        from callgate.tracing import Tracing, tracer_provider

        tracing = Tracing(
            tracer_provider(
                exporter=conf.exporter,
                endpoint=conf.endpoint,
                headers=conf.headers,
                sampling_ratio=conf.sampling_ratio,
                service_name=conf.service_name,
                timeout_s=conf.timeout_s,
                instance_id=self.settings.instance_id,
            )
        )
        tracing.install()
        return tracing

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
        from callgate.domain.identity import SessionVerifier

        trusted = self.trusted_issuers
        if not self.settings.dev:
            return SessionVerifier.of_issuers(trusted)
        try:
            return SessionVerifier(self.keys.session_verification_keys(), trusted=trusted)
        except ValueError as exc:
            raise ConfigError(f"sessions.issuers: {exc}") from None

    @cached_property
    def trusted_issuers(self) -> list[TrustedIssuer]:
        """The configured session issuers; keys that rotate are fetched here, once (ADR
        0078). Raises ``ConfigError`` for an unusable issuer."""
        from callgate.config.key_material import trusted_issuers

        return trusted_issuers(self.settings, self._rotating_keys)

    def _rotating_keys(self, entry: IssuerSettings) -> RotatingKeys:
        """An issuer's keys from its ``jwks_uri`` (or discovery), fetched once now."""
        from callgate.adapters.jwks import RotatingKeys

        keys = RotatingKeys(
            entry.issuer,
            lambda: self.discovery.keys(entry),  # Discovery: an HTTP client, built if needed
            entry.algorithms,
            refresh_s=entry.jwks_refresh_s,
            min_refresh_s=entry.jwks_min_refresh_s,
            max_stale_s=entry.jwks_max_stale_s,
        )
        keys.start()
        return keys

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
        from callgate.adapters.notify.slack import SlackInteractions
        from callgate.config.key_material import SLACK_ISSUER, slack_issuer
        from callgate.domain.identity import SessionIssuer

        found = slack_issuer(self.settings)
        if found is None:
            return None
        kid, key = found
        issuer = SessionIssuer(key, kid, issuer=SLACK_ISSUER)
        return SlackInteractions(self.settings.slack, issuer, self.clock)

    def notifier(self, reader: PendingReader) -> Notifier | None:
        """Tells approvers of the pending view's changes (``[notify]``, ``[slack]``)."""
        from callgate.adapters.notify.notifier import build_notifier

        s = self.settings
        return build_notifier(reader, s.notify, s.slack, s.state_dir, self.clock)

    @cached_property
    def approval_keys(self) -> ApprovalKeys:
        """The active approval-signing key and every verifying key (C11; rotation)."""
        from callgate.config.key_material import approval_keys

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
        from callgate.providers.metrics import instrumented
        from callgate.providers.registry import ProviderRegistry, build_registry, default_context

        context = default_context(
            lambda: self.ledger, self.settings.faults, self.profile, self.channels
        )
        built = build_registry(self.profile, context)
        _ = self.tracing  # installed first: provider calls and upstream requests continue it
        return ProviderRegistry(instrumented(p, self.provider_metrics) for p in built)

    @cached_property
    def channels(self) -> Channels:
        """This process's channels from an upstream's call to the agent waiting for it:
        the surface opens one per call, the MCP provider sends into it (ADR 0075)."""
        from callgate.providers.channels import Channels

        return Channels()

    @cached_property
    def provider_metrics(self) -> ProviderMetrics:
        """Provider latency and errors of this process (``/metrics``)."""
        from callgate.providers.metrics import ProviderMetrics

        return ProviderMetrics()

    def decider(self) -> Decider:
        # What its first call needs and the domain imports where used (PyJWT, ICU: ADR
        # 0089), loaded while the runner starts rather than on that call.
        import icu  # noqa: F401
        import jwt  # noqa: F401

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
        from callgate.executor.executor import Executor

        return Executor(self.profile, self.providers)

    def projections(self) -> list[Process[Any]]:
        from callgate_projections.audit import AuditProjection
        from callgate_projections.decisions import DecisionsProjection
        from callgate_projections.pending import PendingProjection
        from callgate_projections.status import StatusProjection
        from callgate_projections.usage import UsageProjection

        redactor = self.redactor
        return [
            StatusProjection(redactor),
            PendingProjection(redactor),
            AuditProjection(redactor),
            DecisionsProjection(),
            UsageProjection(),
        ]

    def invocations(self) -> Invocations:
        """The decider and the executor as one process (ADR 0077)."""
        from callgate.executor.invocations import Invocations

        return Invocations(self.decider(), self.executor())

    def processes(self) -> list[Process[Any]]:
        """Every process `callgate serve` runs, in pipeline order. The usage of limits
        comes first (ADR 0079): on the embedded store a round runs the processes in order,
        so its answers reach the invocations in the same round."""
        from callgate.decider.usage_process import Usage

        return [Usage(), self.invocations(), *self.projections()]

    # -- backends and runners: built here, for every entry point ---------------------------

    def backend(self) -> Backend:
        """The SDK's backend on the store the settings name (embedded by default)."""
        if self.settings.backend == "kafka":
            return self.kafka_backend()
        return self.embedded_backend()

    def embedded_backend(self) -> EmbeddedBackend:
        """The SDK's backend on the settings' state directory; the runner it may run is
        made here, on its first need."""
        from callgate.adapters.avro_codec import AvroCodec
        from callgate.adapters.embedded.backend import EmbeddedBackend
        from callgate.adapters.embedded.store import EmbeddedStore

        codec = AvroCodec.default()
        store = EmbeddedStore(self.settings.state_dir, codec)
        return EmbeddedBackend(
            store, codec, lambda: self.embedded_runner(store, codec), self.tracing
        )

    def kafka_backend(self) -> KafkaBackend:
        """The SDK's backend on the settings' Kafka deployment."""
        from callgate.adapters.kafka.backend import KafkaBackend

        return KafkaBackend(self.settings, self.projections(), self.tracing)

    def live_kafka_backend(self) -> LiveKafkaBackend:
        """The HTTP server's read model on Kafka (view topics tailed continuously)."""
        from callgate.adapters.kafka.live import LiveKafkaBackend

        return LiveKafkaBackend(self.settings, self.projections(), self.tracing)

    def gateway(self) -> Gateway:
        """A client on the backend the settings name."""
        from callgate.application.client import Gateway

        return Gateway(self, self.backend())

    def embedded_runner(
        self, store: EmbeddedStore, codec: AvroCodec, **options: Any
    ) -> EmbeddedRunner:
        """The runner ``callgate serve`` drives on the embedded store (every process)."""
        from callgate.adapters.embedded.layout import take_over_earlier_layout
        from callgate.adapters.embedded.runner import EmbeddedRunner
        from callgate.domain.process_port import ReadsControl
        from callgate.executor.invocations import Invocations

        def seeded(processes: Sequence[Process[Any]]) -> Sequence[Process[Any]]:
            for process in processes:
                if isinstance(process, ReadsControl):
                    position = store.position(process.name)
                    events = control_events_through(store, codec, position, process.control_events)
                    process.seed(events)
            return processes

        processes = self.processes()
        for process in processes:
            if isinstance(process, Invocations):  # ADR 0077: a store of the earlier layout
                take_over_earlier_layout(
                    store,
                    process,
                    lambda parts: EmbeddedRunner(store, seeded(parts), codec, self.clock),
                )
        return EmbeddedRunner(
            store,
            list(seeded(processes)),
            codec,
            self.clock,
            requests_retention_ms=self.settings.requests_retention_ms,
            tracing=self.tracing,
            **options,
        )

    def kafka_runner(self, process: Process[Any], **options: Any) -> KafkaRunner:
        """The runner of one process on the settings' Kafka deployment (``callgate serve``'s
        workers, the benchmark's replay worker): its topics, brokers, instance id, state
        stores and clock come from here; ``options`` are the runner's tuning."""
        from callgate.adapters.avro_codec import AvroCodec
        from callgate.adapters.kafka.runner import KafkaRunner
        from callgate.adapters.kafka.topics import Topics
        from callgate.adapters.kafka.worker import kafka_state_dir

        settings = self.settings
        return KafkaRunner(
            process,
            AvroCodec.default(),
            Topics(settings.topic_prefix, settings.partitions),
            settings.brokers,
            settings.instance_id,
            kafka_state_dir(settings),
            self.clock,
            **options,
        )

    def again(self) -> App:
        """A second wiring of the same settings and clock (a surface's own verifier cache)."""
        return bootstrap(self.settings, self.clock)


def control_events_through(
    store: EmbeddedStore, codec: AvroCodec, seq: int, types: Sequence[type[Event]]
) -> list[Event]:
    """The control events of ``types`` (policy versions, freezes, pins) of the embedded log
    up to ``seq``, in log order: what a process at that position has folded (ADR 0050,
    0054, 0066, 0067)."""
    from callgate.adapters.avro_codec import MalformedEvent

    rows = [
        row
        for cls in types
        for row in store.read_log("events", event_type=cls.__name__, limit=1_000_000)
        if row.seq <= seq
    ]
    found: list[Event] = []
    for row in sorted(rows, key=lambda r: r.seq):
        try:
            found.append(codec.decode(row.payload))
        except MalformedEvent:
            continue  # a poison row was dead-lettered: no decider saw it
    return found


def bootstrap(settings: Settings, clock: Clock = system_clock) -> App:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return App(settings=settings, clock=clock)
