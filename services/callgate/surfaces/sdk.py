"""The Python SDK for agent platforms and approval UIs, identical on both backends.

    from callgate.surfaces.sdk import connect
    from callgate.bootstrap import Settings

    gate = connect(Settings(state_dir=Path(".callgate")))
    answer = gate.propose(session=token, tool="tickets.read", args={"ticket_id": "T-1"})
    answer["outcome"]  # "executed"

A ``Gateway`` (``callgate.application.client``) publishes request events and reads the
projections; it never decides anything itself: identity comes from the session token the
decider verifies (C6). This module is an entry point: ``connect`` wires one.
"""

from __future__ import annotations

from callgate.application.client import Gateway as Gateway
from callgate.application.client import wait_until as wait_until
from callgate.application.ports import Backend as Backend
from callgate.bootstrap import App, Settings, bootstrap


def connect(settings: Settings, app: App | None = None) -> Gateway:
    """A gateway on the backend the settings name (embedded by default); the composition
    root (``App.gateway``) builds it."""
    return (app or bootstrap(settings)).gateway()
