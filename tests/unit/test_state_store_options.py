"""The Kafka runner's partition stores keep bounded memory and their semantics (ADR 0009).

The decider's per-key state (C8: what an idempotency key replays) lives in these stores; the
memory bound must hold for any number of keys and stores without losing or mixing state.
"""

from __future__ import annotations

import random
from pathlib import Path

from rocksdict import Options, Rdict

from callgate.adapters.kafka.state import (
    BLOCK_CACHE_BYTES,
    MAX_OPEN_FILES,
    MAX_WRITE_BUFFERS,
    WRITE_BUFFER_BYTES,
    PartitionStore,
)

CHANGELOG = "callgate.changelog.decider"


def _written_options(store_dir: Path) -> dict[str, str]:
    """``key=value`` lines of the newest OPTIONS file RocksDB wrote: what it really uses."""
    newest = max(store_dir.glob("OPTIONS-*"), key=lambda p: int(p.name.split("-")[1]))
    found: dict[str, str] = {}
    for line in newest.read_text().splitlines():
        name, sep, value = line.strip().partition("=")
        if sep:
            found.setdefault(name, value)
    return found


def test_rocksdb_applies_the_bounded_options(tmp_path: Path) -> None:
    store = PartitionStore(tmp_path / "p0", CHANGELOG)
    store.close()
    used = _written_options(tmp_path / "p0")
    assert used["write_buffer_size"] == str(WRITE_BUFFER_BYTES)
    assert used["max_write_buffer_number"] == str(MAX_WRITE_BUFFERS)
    assert used["max_open_files"] == str(MAX_OPEN_FILES)
    assert used["cache_index_and_filter_blocks"] == "true"
    assert used["pin_l0_filter_and_index_blocks_in_cache"] == "true"
    assert used["filter_policy"] == "bloomfilter"


def test_a_store_written_with_defaults_is_reopened_bounded(tmp_path: Path) -> None:
    """rocksdict would reopen it with the options of its OPTIONS file (64 MiB memtables)."""
    old = Rdict(str(tmp_path / "p0"), Options(raw_mode=True))  # as state.py opened it before
    old[b"s" + b"k"] = b"v"
    old.close()
    assert _written_options(tmp_path / "p0")["write_buffer_size"] == str(64 << 20)
    store = PartitionStore(tmp_path / "p0", CHANGELOG)
    try:
        assert store.get("k") == b"v"
        assert _written_options(tmp_path / "p0")["write_buffer_size"] == str(WRITE_BUFFER_BYTES)
        assert store.memory()["block-cache-capacity"] == BLOCK_CACHE_BYTES
    finally:
        store.close()


def test_stores_of_a_process_share_one_block_cache(tmp_path: Path) -> None:
    a = PartitionStore(tmp_path / "p0", CHANGELOG)
    a.apply({f"k{i}": b"x" * 200 for i in range(2000)}, 1, "t1")
    a.close()  # reopened below: its state is then read from SST files, through the cache
    a = PartitionStore(tmp_path / "p0", CHANGELOG)
    b = PartitionStore(tmp_path / "p1", CHANGELOG)
    try:
        assert b.get("k1") is None
        assert a.get("k1") == b"x" * 200
        seen_by_a, seen_by_b = a.memory(), b.memory()
        assert seen_by_a["block-cache-capacity"] == BLOCK_CACHE_BYTES
        assert seen_by_b["block-cache-capacity"] == BLOCK_CACHE_BYTES
        # b holds no SST file: its cache usage is a's blocks, so the cache is one.
        assert seen_by_b["block-cache-usage"] == seen_by_a["block-cache-usage"] > 0
    finally:
        a.close()
        b.close()


def test_memtables_stay_bounded_however_much_is_written(tmp_path: Path) -> None:
    rng = random.Random(0)
    store = PartitionStore(tmp_path / "p0", CHANGELOG)
    try:
        for offset in range(1, 49):  # 48 batches of 500 x 1 KiB: 24 MiB, 6x the bound
            batch = {f"k{offset}-{i}": rng.randbytes(1024) for i in range(500)}
            store.apply(batch, offset, f"t{offset}")
            held = store.memory()["cur-size-all-mem-tables"]
            # A memtable may pass its size by a batch and an arena block before it is
            # switched; RocksDB's defaults would hold all 24 MiB here.
            assert held <= MAX_WRITE_BUFFERS * (WRITE_BUFFER_BYTES + (2 << 20))
        assert store.get("k1-0") is not None and store.offset == 48
    finally:
        store.close()


def test_state_survives_flushes_deletes_and_reopen(tmp_path: Path) -> None:
    """Flushed, compacted, filtered: a reopened store returns exactly what was applied."""
    rng = random.Random(1)
    model: dict[str, bytes] = {}
    store = PartitionStore(tmp_path / "p0", CHANGELOG)
    for offset in range(1, 31):  # ~15 MiB of state: several memtable flushes
        batch: dict[str, bytes | None] = {}
        for _ in range(500):
            key = f"k-{rng.randrange(8000):05d}"
            value = None if rng.random() < 0.1 else rng.randbytes(rng.randrange(500, 1500))
            batch[key] = value
        store.apply(batch, offset, f"t{offset}")
        for key, value in batch.items():
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
    store.close()
    store = PartitionStore(tmp_path / "p0", CHANGELOG)
    try:
        assert (store.offset, store.head) == (30, "t30")
        assert dict(store.items()) == model
        assert list(dict(store.items())) == sorted(model)
        assert all(store.get(key) == value for key, value in model.items())
        assert store.get("k-99999") is None
    finally:
        store.close()
