"""Where an upstream's progress notifications of a call go (ADR 0075, progress only).

An agent that asks ``callgate mcp`` for a tool call with a ``progressToken`` opens a
channel for the call's invocation here while it waits; the MCP provider that executes the
invocation in this process sends the upstream's progress notifications into it, and the
surface forwards each to the agent under the agent's own token. The channel exists only
in the process the agent called: a call executed by another process (a ``callgate serve``
holding the embedded store, a Kafka worker) reports no upstream progress, and nothing
else changes. Only what the upstream reports travels: numbers and its message.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# progress, total (None: unknown), message (None: none)
Send = Callable[[float, float | None, str | None], None]
MESSAGE_CHARS = 1_000  # an upstream's message is cut to this before it reaches the agent


class ProgressChannels:
    """The open channels of this process, by invocation id (thread-safe: the surface opens
    them on its event loop, a runner's thread sends into them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, Send] = {}

    def open(self, invocation_id: str, send: Send) -> None:
        with self._lock:
            self._open[invocation_id] = send

    def close(self, invocation_id: str) -> None:
        with self._lock:
            self._open.pop(invocation_id, None)

    def of(self, invocation_id: str) -> Send | None:
        """The channel of ``invocation_id``, which drops what is not a finite number."""
        with self._lock:
            send = self._open.get(invocation_id)
        if send is None:
            return None

        def checked(progress: float, total: float | None, message: str | None) -> None:
            if not _finite(progress) or (total is not None and not _finite(total)):
                return  # malformed upstream progress: dropped, the call goes on
            text = message[:MESSAGE_CHARS] if isinstance(message, str) else None
            send(float(progress), None if total is None else float(total), text)

        return checked


def _finite(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and value == value
        and abs(value) != float("inf")
    )


# The channels of this process (like ``tracing``'s active tracer: process-wide by nature).
CHANNELS = ProgressChannels()
