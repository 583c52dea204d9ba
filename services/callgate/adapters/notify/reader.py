"""What the notifier and the callbacks read: the pending view and the status view."""

from __future__ import annotations

from typing import Any, Protocol


class PendingReader(Protocol):
    def view_items_raw(self, view: str) -> list[tuple[str, str]]: ...

    def view(self, view: str, key: str) -> dict[str, Any] | None: ...
