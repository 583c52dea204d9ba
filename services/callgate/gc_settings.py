"""Garbage-collector settings of callgate's own processes (docs/adr/0021-gc-thresholds.md).

Deciders, projections and replay allocate many short-lived dicts per event and build no
reference cycles (a 10,000-proposal embedded run collected nothing in its 10 full
collections). CPython's default scans the young generation every 700 container
allocations: a third of replay's fold and a tenth of the embedded runner's CPU went to
scans that found nothing. A young generation of 100,000 keeps the collector (cycles are
still reclaimed) at a fraction of the cost. Set by callgate's entry points only (the
command line, ``serve``'s workers, the bench's processes): an application that embeds the
SDK keeps its own.
"""

from __future__ import annotations

import gc

# Container allocations between young-generation collections (CPython's default: 700).
YOUNG_THRESHOLD = 100_000
# Young collections per middle one, middle per full one: CPython's defaults.
MIDDLE_THRESHOLD = 10
OLD_THRESHOLD = 10


def apply_gc_settings() -> None:
    """Set this process's collector thresholds for callgate's allocation pattern."""
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
