"""Settings: everything configurable, one frozen model built at the entry point and passed
down (the composition root, ``callgate.bootstrap``, wires adapters from it; adapters take it
as an argument and never import the composition root)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from callgate.adapters.kafka.connection import Brokers, Property, check_connection
from callgate.config import ConfigError
from callgate.config.loading import load_settings
from callgate.config.sections import (
    ApprovalSettings,
    NotifySettings,
    PinningSettings,
    SessionSettings,
    SlackSettings,
    TracingSettings,
)
from callgate.state_dir import default_state_dir

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

    # No NaN or infinity, in the file or a variable (as in every section: config.sections._Section).
    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_default=False, allow_inf_nan=False
    )

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
    # Replicas of each topic callgate creates; None: three, or every broker of a smaller
    # cluster. Exactly-once across a broker crash needs another in-sync replica to lead
    # (docs/explanation/reliability.md, "Broker kills").
    replication_factor: int | None = Field(default=None, ge=1)
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
    tracing: TracingSettings = TracingSettings()
    pinning: PinningSettings = PinningSettings()
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

    @property
    def brokers(self) -> Brokers:
        """The Kafka brokers and the connection properties every client for them gets."""
        return Brokers(self.bootstrap_servers or "", dict(self.kafka_client))
