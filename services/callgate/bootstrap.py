"""The composition root: the one place where adapters are wired to the pure core.

Settings are one frozen model built at the entry point (CLI, tests, bench) and
passed down; nothing here runs at import time, and the adapters and processes are
imported when first wired, so each command loads only what it uses.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from callgate.state_dir import default_state_dir

if TYPE_CHECKING:
    # Imported where used: a command that needs only the keys (``session issue``) should
    # not pay for the policy engine, JSON Schema and the processes at start-up.
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


def system_clock() -> int:
    """Wall-clock epoch milliseconds: the only clock; passed in everywhere else."""
    return time.time_ns() // 1_000_000


class SettingsError(ValueError):
    """A setting has a value callgate cannot use (the command line reports it as misuse)."""


class Settings(BaseModel):
    """Everything configurable, frozen (docs/contract.md, "Command line" global options)."""

    model_config = ConfigDict(frozen=True)

    # The default is found, not assumed to be the current directory (``callgate.state_dir``).
    state_dir: Path = Field(default_factory=default_state_dir)
    backend: Literal["embedded", "kafka"] = "embedded"
    bootstrap_servers: str | None = None
    profile: Path | None = None
    topic_prefix: str = "callgate"
    partitions: int = Field(default=6, ge=1)
    faults: dict[str, Any] = Field(default_factory=dict)
    # How long a command waits for an answer (a settled call, a broker): ``--timeout``.
    timeout_s: float = Field(default=30.0, gt=0)
    instance_id: str = Field(default_factory=lambda: f"{os.uname().nodename}-{os.getpid()}")
    dev: bool = False
    # How long requests (which carry bearer session tokens) are kept once consumed: the
    # ``requests`` topic's ``retention.ms`` on Kafka, pruning on the embedded store.
    requests_retention_ms: int = Field(default=7 * 24 * 3600 * 1000, ge=0)

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Build from ``CALLGATE_*`` environment variables, then explicit overrides.

        Raises ``SettingsError`` naming the variable or option for a value that is not
        usable (``CALLGATE_BACKEND=foo``, ``CALLGATE_PARTITIONS=x``): that is misuse, not
        an internal error.
        """
        env: dict[str, Any] = {}
        source: dict[str, str] = {}
        for name, field, parse in _ENV:
            if v := os.environ.get(name):
                try:
                    env[field] = parse(v)
                except ValueError as e:
                    raise SettingsError(f"{name}={v!r} is not usable: {e}") from None
                source[field] = name
        for field, v in overrides.items():
            if v is not None:
                env[field] = v
                source[field] = _OPTION.get(field, "--" + field.replace("_", "-"))
        try:
            return cls(**env)
        except ValidationError as e:
            problems = []
            for err in e.errors():
                field = str(err["loc"][0]) if err["loc"] else ""
                where = source.get(field, field)
                problems.append(f"{where}={env.get(field)!r}: {err['msg']}")
            raise SettingsError("; ".join(problems)) from None


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError("expected 1 or 0")
    return text == "1"


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    return value


_OPTION = {"timeout_s": "--timeout"}  # the command-line option of a field, where it differs

# (environment variable, Settings field, parser); a parser raises ValueError when unusable.
_ENV: tuple[tuple[str, str, Callable[[str], Any]], ...] = (
    ("CALLGATE_STATE_DIR", "state_dir", Path),
    ("CALLGATE_BACKEND", "backend", str),
    ("CALLGATE_BOOTSTRAP_SERVERS", "bootstrap_servers", str),
    ("CALLGATE_PROFILE", "profile", Path),
    ("CALLGATE_TOPIC_PREFIX", "topic_prefix", str),
    ("CALLGATE_PARTITIONS", "partitions", int),
    ("CALLGATE_DEV", "dev", _flag),
    ("CALLGATE_FAULTS", "faults", _json_object),
    ("CALLGATE_TIMEOUT", "timeout_s", float),
    ("CALLGATE_REQUESTS_RETENTION_MS", "requests_retention_ms", int),
)


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
        """The development issuer (production verifies the platform's tokens instead)."""
        from callgate.domain.identity import SessionIssuer

        return SessionIssuer(self.keys.session_signing_key, self.keys.session_kid)

    @cached_property
    def session_verifier(self) -> SessionVerifier:
        from callgate.domain.identity import SessionVerifier

        return SessionVerifier(self.keys.session_verification_keys())

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
        from callgate.providers.registry import ProviderRegistry

        return ProviderRegistry.from_profile(self.profile, self.ledger, self.settings.faults)

    def decider(self) -> Decider:
        from callgate.decider import Decider, DeciderDeps
        from callgate.domain.approvals import ApprovalSigner, ApprovalVerifier

        return Decider(
            DeciderDeps(
                profile=self.profile,
                policy=self.policy,
                sessions=self.session_verifier,
                approval_signer=ApprovalSigner(
                    self.keys.approval_signing_key, self.keys.approval_kid
                ),
                approval_verifier=ApprovalVerifier(self.keys.approval_verification_keys()),
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
    return App(settings=settings, clock=clock)
