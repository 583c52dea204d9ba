"""Following one request through a view that the process itself can read cheaply (the
embedded store's indexed views, the HTTP server's in-memory Kafka views)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from callgate.domain.events import Event


class ViewReader(Protocol):
    def publish(self, events: Sequence[Event]) -> Any: ...

    def view(self, view: str, key: str) -> dict[str, Any] | None: ...

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool: ...


def follow_view(
    backend: ViewReader,
    request: Event,
    view: str,
    key: str,
    done: Callable[[dict[str, Any]], bool],
    timeout_s: float,
) -> dict[str, Any] | None:
    """Publish ``request``; the value ``view`` holds at ``key`` once ``done`` (the last one
    seen at the timeout, ``None`` if none). Each check is one lookup, whatever the history."""
    backend.publish([request])
    last: dict[str, Any] | None = None

    def settled() -> bool:
        nonlocal last
        last = backend.view(view, key)
        return last is not None and done(last)

    backend.wait(settled, timeout_s)
    return last
