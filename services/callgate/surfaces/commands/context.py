"""What every command handler receives: the parsed arguments and lazily built parts.

Nothing heavy is imported here: ``callgate --help`` and a misused command line must not
pay for pydantic, rich, the policy engine or a Kafka client. Each part is built the first
time a handler asks for it.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from callgate.bootstrap import App, Settings
    from callgate.surfaces.render import Renderer
    from callgate.surfaces.sdk import Gateway

EXIT_OK, EXIT_FAILED, EXIT_MISUSE = 0, 1, 2


class Misuse(Exception):
    """The command was used wrongly: exit 2 with the message (code ``usage``)."""


@dataclass
class Context:
    """One command's run: arguments in, settings/app/renderer built on first use."""

    ns: argparse.Namespace
    # Set by SIGTERM or SIGINT for a command that runs until stopped (``until_stopped``);
    # the command line installs the handlers before the handler runs.
    stop: threading.Event = field(default_factory=threading.Event)
    _closers: list[Callable[[], None]] = field(default_factory=list)

    @property
    def json_mode(self) -> bool:
        return bool(getattr(self.ns, "json", False))

    @cached_property
    def out(self) -> Renderer:
        from callgate.surfaces.render import Renderer

        return Renderer(json_mode=self.json_mode, log_format=self.ns.log_format)

    @cached_property
    def settings(self) -> Settings:
        """Flags, then ``CALLGATE_*`` variables, then defaults (``Settings.from_env``)."""
        from callgate.bootstrap import Settings

        return Settings.from_env(
            config_file=getattr(self.ns, "config", None),
            dev=getattr(self.ns, "dev", None),
            state_dir=getattr(self.ns, "state_dir", None),
            backend=getattr(self.ns, "backend", None),
            bootstrap_servers=getattr(self.ns, "bootstrap_servers", None),
            profile=getattr(self.ns, "profile", None),
            timeout_s=getattr(self.ns, "timeout", None),
            instance_id=getattr(self.ns, "instance_id", None),
        )

    @cached_property
    def app(self) -> App:
        """The wired application, with its profile loaded: an unreadable profile is misuse
        that must surface before a command publishes anything."""
        from callgate.bootstrap import bootstrap

        app = bootstrap(self.settings)
        app.profile  # noqa: B018
        # Likewise the key files the configuration names: a broken one fails at start.
        app.session_verifier  # noqa: B018
        app.approval_keys  # noqa: B018
        return app

    def needs_kafka_servers(self) -> None:
        if self.settings.backend == "kafka" and not self.settings.bootstrap_servers:
            raise Misuse(
                "--backend kafka needs --bootstrap-servers (or CALLGATE_BOOTSTRAP_SERVERS)"
            )

    def gateway(self) -> Gateway:
        """The SDK client on the configured backend, closed when the command ends."""
        from callgate.surfaces.sdk import connect

        self.needs_kafka_servers()
        gate = connect(self.settings, self.app)
        self._closers.append(gate.close)
        return gate

    def close(self) -> None:
        while self._closers:
            self._closers.pop()()


Handler = Callable[[Context], int]
