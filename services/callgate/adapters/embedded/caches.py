"""What the embedded runner keeps in memory between rounds.

Because the runner is the only writer of positions and states while it holds the lock, it
keeps caches valid only for what has been committed, dropped whenever anything fails or the
lock changes hands:

- decoded events by ``seq`` (``decoded_rows``): a row is decoded once, however many
  processes read it (log rows never change once committed);
- per process, the committed state object of recently committed keys with its stored
  bytes, so a key seen again skips ``load_state``. A projection never changes a state in
  place (its states are frozen), so when it returns the very object it was given the state
  is unchanged and ``dump_state`` is skipped; every other process is dumped and compared;
- each process's position after the last round, which tells which decoded rows every
  process has consumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from callgate.adapters.embedded.decoded_rows import DecodedRows
from callgate.adapters.unit_of_work import StateCache
from callgate.domain.events import Event
from callgate.domain.process_port import Process


class RunnerCaches:
    """The caches of a runner of ``processes`` (``state_cache_keys`` states per process)."""

    def __init__(
        self,
        processes: Sequence[Process[Any]],
        decode: Callable[[bytes], Event],
        state_cache_keys: int,
    ) -> None:
        self.states: dict[str, StateCache[str]] = {
            p.name: StateCache(state_cache_keys) for p in processes
        }
        self.decoded = DecodedRows(decode)
        self.positions: dict[str, int] = {}
        self._processes = len(processes)

    def forget(self) -> None:
        """Drop every cache: after a failure (a rolled-back transaction may have changed a
        cached state in place, or decoded rows whose ``seq`` will be reused) and whenever
        the lock changes hands (another runner may have moved on in between)."""
        for cache in self.states.values():
            cache.clear()
        self.decoded.clear()
        self.positions.clear()

    @contextmanager
    def guard(self) -> Iterator[None]:
        """``forget`` when the work inside fails."""
        try:
            yield
        except BaseException:
            self.forget()
            raise

    def prune_decoded(self) -> None:
        """Drop the decoded rows every process has consumed (once each has a position)."""
        every = len(self.positions) == self._processes
        self.decoded.prune(self.positions.values() if every else ())
