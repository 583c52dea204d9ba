"""The client over a backend: one object with every use case, for the SDK and the surfaces.

``Gateway`` publishes request events and reads the projections; it never decides anything
itself: identity comes from the session token the decider verifies (C6).
``callgate.surfaces.sdk.connect`` (an entry point) gives one wired by the composition root.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from callgate.application.agent_calls import AgentCalls
from callgate.application.approvals import Approvals
from callgate.application.operators import OperatorCommands
from callgate.application.queries import Queries
from callgate.application.sessions import Sessions


class Gateway(AgentCalls, Approvals, Queries, OperatorCommands, Sessions):
    """The client: ``propose``, ``pending``, ``approve``, ``deny``, ``status``, ``audit``,
    and the operators' commands (``callgate.application`` holds each use case)."""


def wait_until(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True
