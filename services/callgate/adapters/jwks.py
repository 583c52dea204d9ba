"""An identity provider's keys as they rotate (ADR 0078): fetched from its ``jwks_uri``
at start, again every ``refresh_s`` and when a token names a kid they lack (at most once
per ``min_refresh_s``), and kept through failed fetches for at most ``max_stale_s``
after the last good one; after that no key verifies (fail closed).

An adapter: it owns the HTTP client and the clock; the verifier
(``callgate.domain.identity.SessionVerifier``) only reads ``current()`` and asks
``refresh()`` (the ``KeySet`` protocol). A refresh that is due runs in the calling
thread, one at a time: others keep verifying with the keys in hand meanwhile.

Not PyJWT's ``PyJWKClient``: it fetches again for every unknown kid (a token with a
made-up kid would make callgate call the provider each time) and drops its keys when a
fetch fails.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from callgate.adapters.keyfiles import parse_jwks
from callgate.domain.keys import PublicKey, algorithm_of

log = logging.getLogger(__name__)

# Fetches the JWKS document; raises OSError or ValueError naming what failed.
Fetch = Callable[[], Mapping[str, Any]]


class RotatingKeys:
    """One issuer's keys (the ``KeySet`` protocol)."""

    def __init__(
        self,
        issuer: str,
        fetch: Fetch,
        algorithms: tuple[str, ...],
        *,
        refresh_s: float,
        min_refresh_s: float,
        max_stale_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.issuer = issuer
        self._fetch = fetch
        self._algorithms = algorithms
        self._refresh_s = refresh_s
        self._min_refresh_s = min_refresh_s
        self._max_stale_s = max_stale_s
        self._clock = clock
        self._keys: Mapping[str, PublicKey] = MappingProxyType({})
        self._document: Mapping[str, Any] | None = None
        self._fetched_at = -float("inf")  # the last good fetch
        self._tried_at = -float("inf")  # the last attempt, good or not
        self._busy = threading.Lock()

    def start(self) -> None:
        """The first fetch: raises (``OSError``, ``ValueError``) when it fails, so that a
        provider that cannot be reached, or keys of a refused algorithm, fail at start."""
        doc = self._fetch()
        keys = parse_jwks(doc, f"{self.issuer} jwks_uri")
        for kid, key in keys.items():
            if algorithm_of(key) not in self._algorithms:
                allowed = ", ".join(self._algorithms)
                raise ValueError(
                    f"key {kid!r} is {algorithm_of(key)}, not among the allowed ({allowed})"
                )
        now = self._clock()
        self._install(doc, keys, now)

    def _install(self, doc: Mapping[str, Any], keys: Mapping[str, PublicKey], now: float) -> None:
        # The same document keeps the same key objects: verified tokens stay cached.
        if doc != self._document:
            self._keys, self._document = MappingProxyType(dict(keys)), doc
        self._fetched_at = self._tried_at = now

    def current(self) -> Mapping[str, PublicKey]:
        now = self._clock()
        if now - self._tried_at >= self._refresh_s:
            self._attempt(now)  # the timer: the first verification after it is due
        if self._clock() - self._fetched_at > self._max_stale_s:
            return MappingProxyType({})  # too old to trust: the provider may have revoked
        return self._keys

    def refresh(self) -> bool:
        now = self._clock()
        if now - self._tried_at < self._min_refresh_s:
            return False
        return self._attempt(now)

    def _attempt(self, now: float) -> bool:
        if not self._busy.acquire(blocking=False):
            return False  # another thread is fetching; use the keys in hand
        try:
            self._tried_at = now
            try:
                doc = self._fetch()
                keys = parse_jwks(doc, f"{self.issuer} jwks_uri")
            except (OSError, ValueError) as exc:  # KeyFileError is a ValueError
                age = now - self._fetched_at
                log.warning(
                    "%s: keys not refreshed (%s); last good %.0f s ago", self.issuer, exc, age
                )
                return False
            # A key of an algorithm the issuer may not use is left out, never trusted.
            usable = {k: v for k, v in keys.items() if _algorithm(v) in self._algorithms}
            self._install(doc, usable, self._clock())
            return True
        finally:
            self._busy.release()


def _algorithm(key: PublicKey) -> str | None:
    try:
        return algorithm_of(key)
    except ValueError:
        return None
