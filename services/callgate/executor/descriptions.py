"""Providers' descriptions of resources (who owns a target), reused for a while.

A description answers the decider's ``ResourceDescriptionRequested`` (ADR 0014): the
executor reuses one for ``DESCRIPTION_TTL_MS`` (bounded in size), and an execution of a
mutating tool on that provider drops the provider's entries. Not folded state, so apart
from the executor's: the answer used is on the log.
"""

from __future__ import annotations

from collections import OrderedDict

from callgate.providers.base import ResourceDescription

DESCRIPTION_TTL_MS = 30_000  # how long a provider's description of a resource is reused


class DescriptionCache:
    """Provider descriptions by (provider, target) for ``ttl_ms``; at most ``size`` kept."""

    def __init__(self, ttl_ms: int, size: int = 10_000) -> None:
        self._ttl_ms, self._size = ttl_ms, size
        self._entries: OrderedDict[tuple[str, str], tuple[ResourceDescription, int]] = OrderedDict()

    def get(self, provider: str, target: str, now_ms: int) -> ResourceDescription | None:
        entry = self._entries.get((provider, target))
        if entry is None or now_ms >= entry[1]:
            return None
        return entry[0]

    def put(self, provider: str, target: str, found: ResourceDescription, now_ms: int) -> None:
        if self._ttl_ms <= 0:
            return
        self._entries[(provider, target)] = (found, now_ms + self._ttl_ms)
        self._entries.move_to_end((provider, target))
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def forget(self, provider: str) -> None:
        for key in [k for k in self._entries if k[0] == provider]:
            del self._entries[key]
