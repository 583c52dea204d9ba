"""Per-process, per-partition state: a rocksdict store restored from a compacted changelog.

Each runner keeps, for every partition it owns, an ``Rdict`` under
``<state_dir>/<process>/p<partition>`` holding key -> state bytes, plus the changelog offset
the store reflects and the *token* of the last transaction it applied. State writes go to the
changelog inside the runner's transaction (with outputs and consumer offsets) and into the
store only after the commit, so the store never holds uncommitted state; it may lag (a crash
between commit and apply), never lead: a store ahead of the broker's committed bound is
another world's (a recreated topic, another cluster) and is wiped.

Which changelog records are committed? A ``read_committed`` reader knows, but on Apache Kafka
it reads no further than the partition's last stable offset (LSO): the first offset of the
oldest open transaction. The instance that owned a partition before this one may have left
such a transaction behind (SIGKILLed, or cut off mid-commit by a rebalance); the transaction
coordinator aborts it only after ``transaction.timeout.ms`` (``checkpoint.TRANSACTION_TIMEOUT_MS``),
so a ``read_committed`` restore would hold every failover (ADR 0015) that long. The restore
reads uncommitted instead and makes committedness readable from the log itself:

- every transaction has a unique token; each changelog record it writes carries headers
  ``cg-txn`` (its token) and ``cg-prev`` (the token of the last *committed* transaction that
  wrote this partition when it began);
- in the same transaction the runner commits, for the consumer group, an offset on the
  changelog partition itself: one past its last changelog record. That "changelog bound"
  is committed atomically with the transaction (it is an offset commit: an aborted
  ``send_offsets_to_transaction`` leaves the group's offsets untouched).

Restore reads ``[stored offset, bound)``, takes the token of the last record before the
bound as the head, and follows ``cg-prev`` back: only records of that chain are applied, so
the records of an open or aborted transaction below the bound are skipped.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBatch, WriteBufferManager

from callgate.adapters.kafka.client import (
    client_config,
    committed_offsets,
    fetched,
    headers_of,
    position,
)
from callgate.adapters.kafka.connection import BrokerAddress
from callgate.adapters.kafka.topics import Topics

HEADER_TXN = "cg-txn"
HEADER_PREV = "cg-prev"

_STATE = b"s"
_OFFSET = b"m:offset"
_HEAD = b"m:head"
_TOPIC = b"m:topic"

# Memory of all the stores of one OS process (docs/adr/0009-state-store-memory.md). RocksDB's
# defaults give every store its own 32 MiB block cache and up to 2 x 64 MiB of memtables,
# so a runner owning 6 partitions could hold ~1 GiB (667 MB measured with a million keys);
# these budgets are shared instead.
BLOCK_CACHE_BYTES = 8 << 20  # one LRU cache: data, index and filter blocks of every store
MEMTABLE_BUDGET_BYTES = 16 << 20  # every store's memtables together (WriteBufferManager)
WRITE_BUFFER_BYTES = 4 << 20  # one memtable; flushed to an SST file when full
MAX_WRITE_BUFFERS = 2  # the active memtable + one being flushed
MAX_OPEN_FILES = 64  # per store: bounds table readers and file descriptors
BLOOM_BITS_PER_KEY = 10  # ~1% false positives: a new key's lookup seldom reads a data block
_MEMORY = (
    "cur-size-all-mem-tables",
    "estimate-table-readers-mem",
    "block-cache-usage",
    "block-cache-capacity",
)


@cache
def _shared_memory() -> tuple[Cache, WriteBufferManager]:
    """The block cache and memtable budget every store of this process shares."""
    return Cache(BLOCK_CACHE_BYTES), WriteBufferManager(MEMTABLE_BUDGET_BYTES, False)


def store_options() -> Options:
    """Options of a partition store: bounded memory, whatever the number of keys or stores.

    Index and filter blocks live in the shared block cache (not on the heap per open file),
    with level-0 ones pinned so that lookups of new keys stay cheap; a bloom filter keeps
    those lookups (every new idempotency key is one) from reading data blocks.
    """
    block_cache, memtables = _shared_memory()
    table = BlockBasedOptions()
    table.set_block_cache(block_cache)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
    options = Options(raw_mode=True)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_manager(memtables)
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    options.set_max_write_buffer_number(MAX_WRITE_BUFFERS)
    options.set_max_open_files(MAX_OPEN_FILES)
    return options


@dataclass(frozen=True, slots=True)
class ChangelogEntry:
    offset: int
    key: str
    value: bytes | None  # None: tombstone
    token: str
    prev: str


class ChainBroken(RuntimeError):
    """The changelog records after a local store do not lead back to its head."""


def select_committed(
    entries: Sequence[ChangelogEntry], local_head: str, full: bool
) -> tuple[list[ChangelogEntry], str]:
    """The committed entries among ``entries`` (all offsets below the changelog bound).

    The last entry belongs to the last committed transaction (the bound is one past it).
    Its token and the ``prev`` links form the chain of committed transactions back to
    ``local_head`` (the last transaction already in the local store; "" for none). Entries
    of other tokens are leftovers of aborted or killed transactions. Returns
    ``(committed entries in log order, new head)``.

    ``full`` (reading from offset 0): a chain that ends at a token no longer in the log
    means compaction removed older records; those that remain before the chain are
    accepted, as a Kafka reader would see them. Otherwise a broken chain raises
    ``ChainBroken`` and the caller restores from offset 0.
    """
    if not entries:
        return [], local_head
    prev_of: dict[str, str] = {}
    for entry in entries:
        prev_of.setdefault(entry.token, entry.prev)
    head = entries[-1].token
    chain: set[str] = set()
    token = head
    while token and token != local_head and token in prev_of and token not in chain:
        chain.add(token)
        token = prev_of[token]
    if token != local_head:
        if not full or token in chain:
            raise ChainBroken(f"changelog chain from {head!r} stops at {token!r}")
        first = min((e.offset for e in entries if e.token in chain), default=entries[-1].offset)
        return [e for e in entries if e.token in chain or e.offset < first], head
    return [e for e in entries if e.token in chain], head


class PartitionStore:
    """One rocksdict per (process, partition): state bytes + changelog offset + head token."""

    def __init__(self, path: Path, changelog: str) -> None:
        self.path = path
        self.changelog = changelog
        path.parent.mkdir(parents=True, exist_ok=True)
        self._options = store_options()
        self._db = self._open()
        stored_topic = self._db.get(_TOPIC)
        if stored_topic is not None and stored_topic != changelog.encode():
            self.wipe()  # another deployment's state: never mix it in
        if stored_topic is None:
            self._db[_TOPIC] = changelog.encode()

    @property
    def offset(self) -> int:
        raw = self._db.get(_OFFSET)
        return int(raw) if raw is not None else 0

    @property
    def head(self) -> str:
        raw = self._db.get(_HEAD)
        return raw.decode() if raw is not None else ""

    def get(self, key: str) -> bytes | None:
        value = self._db.get(_STATE + key.encode())
        return None if value is None else bytes(value)

    def items(self) -> Iterator[tuple[str, bytes]]:
        for raw_key, value in self._db.items(from_key=_STATE):
            assert isinstance(raw_key, bytes) and isinstance(value, bytes)  # raw_mode
            if not raw_key.startswith(_STATE):
                break
            yield raw_key[len(_STATE) :].decode(), value

    def apply(self, states: Mapping[str, bytes | None], offset: int, head: str) -> None:
        """Write committed states and the changelog position they reflect, atomically."""
        batch = WriteBatch(raw_mode=True)
        for key, value in states.items():
            if value is None:
                batch.delete(_STATE + key.encode())
            else:
                batch.put(_STATE + key.encode(), value)
        batch.put(_OFFSET, str(offset).encode())
        batch.put(_HEAD, head.encode())
        self._db.write(batch)

    def memory(self) -> dict[str, int]:
        """RocksDB's own accounting, in bytes: this store's memtables and table readers, and
        the block cache (shared by every store of the process: ``store_options``)."""
        return {name: self._db.property_int_value(f"rocksdb.{name}") or 0 for name in _MEMORY}

    def wipe(self) -> None:
        self._db.close()
        Rdict.destroy(str(self.path), self._options)
        shutil.rmtree(self.path, ignore_errors=True)
        self._db = self._open()
        self._db[_TOPIC] = self.changelog.encode()

    def _open(self) -> Rdict:
        # Naming the default column family makes these options apply to an existing store
        # too: given ``options`` alone, rocksdict reopens a store with the column family
        # options of its OPTIONS file (a store written before ADR 0009 keeps 64 MiB
        # memtables) and a private 8 MiB block cache, not the shared one.
        return Rdict(str(self.path), self._options, column_families={"default": self._options})

    def close(self) -> None:
        self._db.close()


class ChangelogReader:
    """Reads ``[start, bound)`` of a changelog partition, ending at the bound or at EOF."""

    def __init__(self, bootstrap: BrokerAddress, timeout_s: float = 60.0) -> None:
        self._timeout_s = timeout_s
        self._consumer = Consumer(
            {
                **client_config(bootstrap),
                "group.id": "callgate.restore",  # assign() only: never joined or committed
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                # Committedness comes from the token chain (module docstring), so an open
                # transaction of a zombie cannot stall the restore behind the LSO.
                "isolation.level": "read_uncommitted",
            }
        )

    def read(self, topic: str, partition: int, start: int, bound: int) -> list[ChangelogEntry]:
        if start >= bound:
            return []
        tp = TopicPartition(topic, partition, start)
        self._consumer.assign([tp])
        entries: list[ChangelogEntry] = []
        deadline = time.monotonic() + self._timeout_s
        try:
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{topic}[{partition}] not read to {bound} in time")
                for msg in fetched(self._consumer, 0.1):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            return entries
                        raise KafkaException(err)
                    offset = position(msg)[2]
                    if offset >= bound:
                        return entries
                    entries.append(_entry(offset, msg.key(), msg.value(), headers_of(msg)))
                    if offset == bound - 1:
                        return entries
        finally:
            self._consumer.unassign()

    def committed_bounds(
        self,
        consumer: Consumer,
        topic: str,
        partitions: Sequence[int],
        timeout_s: float | None = None,
    ) -> dict[int, int | None]:
        """The group's committed changelog bound per partition (None: nothing committed)."""
        tps = committed_offsets(
            consumer,
            [TopicPartition(topic, p) for p in partitions],
            self._timeout_s if timeout_s is None else timeout_s,
        )
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in tps}

    def close(self) -> None:
        self._consumer.close()


def _entry(
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
) -> ChangelogEntry:
    found = {name: (raw or b"").decode() for name, raw in headers or ()}
    return ChangelogEntry(
        offset=offset,
        key=(key or b"").decode(),
        value=value,
        token=found.get(HEADER_TXN, ""),
        prev=found.get(HEADER_PREV, ""),
    )


def restore_partition(
    store: PartitionStore, reader: ChangelogReader, partition: int, bound: int | None
) -> int:
    """Bring ``store`` up to the committed changelog ``bound``; returns entries applied."""
    if bound is None:
        if store.offset or store.head:
            store.wipe()  # the log knows no committed state: nor may we (fail closed)
        return 0
    if store.offset > bound:
        store.wipe()  # ahead of the log: a store from another broker/world (module docstring)
    start, local_head = store.offset, store.head
    if start == bound:
        return 0
    entries = reader.read(store.changelog, partition, start, bound)
    try:
        valid, head = select_committed(entries, local_head, full=start == 0)
    except ChainBroken:
        store.wipe()
        entries = reader.read(store.changelog, partition, 0, bound)
        valid, head = select_committed(entries, "", full=True)
    latest: dict[str, bytes | None] = {}
    for entry in valid:
        latest[entry.key] = entry.value
    store.apply(latest, bound, head)
    return len(valid)


@dataclass(frozen=True, slots=True)
class CommittedChangelog:
    """The committed state of one process, read from the broker alone."""

    states: dict[str, bytes]
    tokens: frozenset[str]  # every committed transaction that wrote the changelog


def read_committed_changelog(
    bootstrap: BrokerAddress, topics: Topics, process: str, timeout_s: float = 30.0
) -> CommittedChangelog:
    """Rebuild a process's committed state from its changelog (tests, ``replay``)."""
    changelog = topics.changelog(process)
    group = Consumer(client_config(bootstrap, **{"group.id": topics.group(process)}))
    reader = ChangelogReader(bootstrap, timeout_s)
    try:
        meta = group.list_topics(changelog, timeout=timeout_s).topics[changelog]
        bounds = reader.committed_bounds(group, changelog, sorted(meta.partitions))
        states: dict[str, bytes] = {}
        tokens: set[str] = set()
        for partition, bound in bounds.items():
            if bound is None:
                continue
            valid, _ = select_committed(reader.read(changelog, partition, 0, bound), "", True)
            tokens.update(e.token for e in valid)
            for entry in valid:
                if entry.value is None:
                    states.pop(entry.key, None)
                else:
                    states[entry.key] = entry.value
        return CommittedChangelog(states, frozenset(tokens))
    finally:
        reader.close()
        group.close()
