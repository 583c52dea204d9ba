"""The composition root: the one place where adapters are wired to the pure core.

Settings are one frozen model built at the entry point (CLI, tests, bench) and
passed down; nothing here runs at import time.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from callgate.decider import Decider, DeciderDeps
from callgate.domain.approvals import ApprovalSigner, ApprovalVerifier
from callgate.domain.catalog import Profile, default_profile_path, load_profile
from callgate.domain.identity import SessionIssuer, SessionVerifier
from callgate.domain.keys import KeyRing
from callgate.domain.policy import PolicyEngine
from callgate.domain.process import Process
from callgate.executor.process import Executor
from callgate.providers.ledger import EffectLedger
from callgate.providers.registry import ProviderRegistry
from callgate_projections.audit import AuditProjection
from callgate_projections.decisions import DecisionsProjection
from callgate_projections.pending import PendingProjection
from callgate_projections.status import StatusProjection

Clock = Callable[[], int]


def system_clock() -> int:
    """Wall-clock epoch milliseconds: the only clock; passed in everywhere else."""
    return time.time_ns() // 1_000_000


class Settings(BaseModel):
    """Everything configurable, frozen (DESIGN "Command line" global options)."""

    model_config = ConfigDict(frozen=True)

    state_dir: Path = Path(".callgate")
    backend: Literal["embedded", "kafka"] = "embedded"
    bootstrap_servers: str | None = None
    profile: Path | None = None
    topic_prefix: str = "callgate"
    partitions: int = Field(default=6, ge=1)
    faults: dict[str, Any] = Field(default_factory=dict)
    instance_id: str = Field(default_factory=lambda: f"{os.uname().nodename}-{os.getpid()}")
    dev: bool = False

    @classmethod
    def from_env(cls, **overrides: Any) -> Settings:
        """Build from ``CALLGATE_*`` environment variables, then explicit overrides."""
        env: dict[str, Any] = {}
        if v := os.environ.get("CALLGATE_STATE_DIR"):
            env["state_dir"] = Path(v)
        if v := os.environ.get("CALLGATE_BACKEND"):
            env["backend"] = v
        if v := os.environ.get("CALLGATE_BOOTSTRAP_SERVERS"):
            env["bootstrap_servers"] = v
        if v := os.environ.get("CALLGATE_PROFILE"):
            env["profile"] = Path(v)
        if v := os.environ.get("CALLGATE_TOPIC_PREFIX"):
            env["topic_prefix"] = v
        if v := os.environ.get("CALLGATE_PARTITIONS"):
            env["partitions"] = int(v)
        if os.environ.get("CALLGATE_DEV") == "1":
            env["dev"] = True
        if v := os.environ.get("CALLGATE_FAULTS"):
            env["faults"] = json.loads(v)
        env.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**env)


@dataclass
class App:
    """The wired application: the processes and the adapters they need."""

    settings: Settings
    clock: Clock

    @cached_property
    def profile(self) -> Profile:
        return load_profile(self.settings.profile or default_profile_path())

    @cached_property
    def keys(self) -> KeyRing:
        return KeyRing.load_or_create(self.settings.state_dir)

    @cached_property
    def session_issuer(self) -> SessionIssuer:
        """The development issuer (production verifies the platform's tokens instead)."""
        return SessionIssuer(self.keys.session_signing_key, self.keys.session_kid)

    @cached_property
    def session_verifier(self) -> SessionVerifier:
        return SessionVerifier(self.keys.session_verification_keys())

    @cached_property
    def policy(self) -> PolicyEngine:
        return PolicyEngine(self.profile)

    @cached_property
    def ledger(self) -> EffectLedger:
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        return EffectLedger(self.settings.state_dir / "effects.sqlite")

    @cached_property
    def providers(self) -> ProviderRegistry:
        return ProviderRegistry.simulated(self.ledger, self.settings.faults)

    def decider(self) -> Decider:
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
        return Executor(self.profile, self.providers)

    def projections(self) -> list[Process[Any]]:
        return [StatusProjection(), PendingProjection(), AuditProjection(), DecisionsProjection()]

    def processes(self) -> list[Process[Any]]:
        """Every process `callgate serve` runs, in pipeline order."""
        return [self.decider(), self.executor(), *self.projections()]


def bootstrap(settings: Settings, clock: Clock = system_clock) -> App:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return App(settings=settings, clock=clock)
