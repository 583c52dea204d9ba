"""The partitions a Kafka runner owns: their state stores, the committed input positions
and the timer index, restored from the broker on assignment and after an abort.

On assignment each store is brought up to the committed changelog (the store never holds
uncommitted state), the timer index is rebuilt from the stored states, and the group's
committed input positions are read: the rewind target after an aborted transaction, and
the line below which a record fetched before a rebalance is already handled.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from callgate.adapters.kafka.client import committed_offsets
from callgate.adapters.kafka.state import ChangelogReader, PartitionStore, restore_partition
from callgate.adapters.kafka.watchdog import CALL_TIMEOUT_S

Key = tuple[int, str]  # (partition, partition_key)
Bounded = Callable[[str], contextlib.AbstractContextManager[None]]


class OwnedPartitions:
    """State stores under ``<state_dir>/p<partition>`` for the ``changelog`` topic's
    partitions this runner owns, with their committed input positions and due timers.

    ``restore`` reads the changelog with ``reader`` and the committed positions of the
    runner's consumer (``group``), each blocking call ``bounded``; ``next_due``: the timer
    of a stored state."""

    def __init__(
        self,
        state_dir: Path,
        changelog: str,
        inputs: Sequence[str],
        reader: ChangelogReader,
        group: Consumer,
        next_due: Callable[[bytes], int | None],
        bounded: Bounded,
    ) -> None:
        self._state_dir = state_dir
        self._changelog = changelog
        self._inputs = inputs
        self._reader = reader
        self._group = group
        self._next_due = next_due
        self._bounded = bounded
        self.stores: dict[int, PartitionStore] = {}
        self.committed: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset
        self._due: dict[Key, int] = {}
        self._heap: list[tuple[int, int, str]] = []

    def __contains__(self, partition: int) -> bool:
        return partition in self.stores

    def owned(self) -> list[int]:
        return sorted(self.stores)

    def read(self, keys: Sequence[Key]) -> dict[Key, bytes | None]:
        """The stored bytes of ``keys`` (absent: ``None``)."""
        return {key: self.stores[key[0]].get(key[1]) for key in keys}

    def handled(self, topic: str, partition: int, offset: int) -> bool:
        """Whether a record is not ours (any more) or already committed: fetched before a
        rebalance or a rewind."""
        return partition not in self.stores or offset < self.committed.get((topic, partition), 0)

    # --- timers ------------------------------------------------------------------------------

    def set_due(self, key: Key, due: int | None) -> None:
        if due is None:
            self._due.pop(key, None)
        elif self._due.get(key) != due:
            self._due[key] = due
            heapq.heappush(self._heap, (due, key[0], key[1]))

    def next_due(self) -> int | None:
        """The soonest indexed timer (possibly superseded: never later than the real one)."""
        return self._heap[0][0] if self._heap else None

    def due_keys(self, now: int) -> Iterator[Key]:
        """Owned keys whose indexed timer is due, soonest first (entries a later index
        superseded are skipped: lazy deletion); each leaves the index as it is yielded."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            due, partition, pkey = heapq.heappop(heap)
            key = (partition, pkey)
            if self._due.get(key) != due or partition not in self.stores:
                continue
            del self._due[key]
            yield key

    # --- ownership ---------------------------------------------------------------------------

    def take(self, partitions: Iterable[int]) -> None:
        """Own ``partitions`` (their stores opened; ``restore`` brings them up to date)."""
        self.close()
        for partition in partitions:
            path = self._state_dir / f"p{partition}"
            self.stores[partition] = PartitionStore(path, self._changelog)

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self.stores.clear()
        self.committed.clear()
        self._due.clear()
        self._heap.clear()

    def stored(self, size: int) -> Iterator[list[tuple[Key, bytes]]]:
        """Every stored state, in lists of up to ``size``. Read lazily (a RocksDB iterator
        reads a consistent snapshot while commits write between two lists), so memory does
        not grow with the number of stored keys."""
        for partition, store in sorted(self.stores.items()):
            items = (((partition, pkey), blob) for pkey, blob in store.items())
            while chunk := list(itertools.islice(items, size)):
                yield chunk

    def restore(self) -> None:
        """Bring every owned store up to the committed changelog; rebuild the timer index
        (``next_due`` of a stored state); read the committed input positions."""
        reader, group, next_due, bounded = self._reader, self._group, self._next_due, self._bounded
        owned = self.owned()
        with bounded("committed changelog bounds"):
            bounds = reader.committed_bounds(group, self._changelog, owned, CALL_TIMEOUT_S)
        self._due.clear()
        self._heap.clear()
        for partition in owned:
            store = self.stores[partition]
            restore_partition(store, reader, partition, bounds[partition])
            for pkey, blob in store.items():
                self.set_due((partition, pkey), next_due(blob))
        inputs = [TopicPartition(t, p) for t in self._inputs for p in owned]
        committed: list[TopicPartition] = []
        if inputs:
            with bounded("committed input positions"):
                committed = committed_offsets(group, inputs, CALL_TIMEOUT_S)
        self.committed = {(tp.topic, tp.partition): tp.offset for tp in committed if tp.offset >= 0}

    def seek(self) -> None:
        """Seek every owned input partition to its committed position (after a restore)."""
        group = self._group
        for topic in self._inputs:
            for partition in self.stores:
                offset = self.committed.get((topic, partition), OFFSET_BEGINNING)
                group.seek(TopicPartition(topic, partition, offset))
