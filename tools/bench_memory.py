"""Peak RSS of a decider holding state for N idempotency keys (run as a subprocess).

The real decider decides N proposals, each with its own idempotency key, and its
per-key state goes to the rocksdict partition stores the Kafka runner uses: one store per
partition of the decider's topics (``callgate serve`` runs one decider owning them all),
written per partition after each batch of ``BATCH`` proposals, as the runner writes after
each transaction. Peak RSS is this process's own high-water mark (``VmHWM``).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from callgate.adapters.kafka.state import PartitionStore
from callgate.bootstrap import App, Settings, bootstrap
from callgate.decider import Decider
from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.gc_settings import apply_gc_settings
from tools.bench_core import mixed_proposals, peak_rss_mb

BATCH = 500  # the Kafka runner's default batch size (records per transaction)
TENANT = "acme"  # mixed_proposals' default tenant


def keyed_proposals(app: App, n: int, seed: int) -> Iterator[ev.ToolCallProposed]:
    """The benchmark mix (70% reads, 20% low-, 10% high-impact mutations) with an
    idempotency key on every call, so each proposal adds one key's state. The decider
    accepts a key on a read as on a mutation (C8: replay protection only)."""
    for i, p in enumerate(mixed_proposals(app, n, seed=seed, tenant=TENANT)):
        key = f"bench-{seed}-{i}"  # mixed_proposals' key for its mutations: unique per run
        pk = partition_key(TENANT, key, p.invocation_id)
        yield dataclasses.replace(p, idempotency_key=key, partition_key=pk)


def decide_into(
    app: App, decider: Decider, stores: list[PartitionStore], keys: int
) -> tuple[int, int]:
    """Decide ``keys`` keyed proposals into ``stores``; returns (idempotency keys recorded
    in the states written, changelog offset reached)."""
    recorded = 0
    offset = 0
    done = 0
    while done < keys:
        batch: list[dict[str, bytes | None]] = [{} for _ in stores]
        for p in keyed_proposals(app, min(BATCH, keys - done), seed=done + 1):
            part = zlib.crc32(p.partition_key.encode()) % len(stores)  # an even spread
            blob = stores[part].get(p.partition_key)
            state = decider.load_state(blob) if blob is not None else decider.initial_state()
            state, _ = decider.handle(state, p, app.clock())
            recorded += p.idempotency_key in state.keys
            batch[part][p.partition_key] = decider.dump_state(state)
        offset += 1
        for store, states in zip(stores, batch, strict=True):
            if states:
                store.apply(states, offset, f"bench-{offset}")
        done += BATCH
    return recorded, offset


def main(keys: int) -> None:
    apply_gc_settings()  # as a worker's
    with tempfile.TemporaryDirectory() as d:
        app = bootstrap(Settings(state_dir=Path(d), dev=True))
        decider = app.decider()
        changelog = "callgate.changelog.decider"
        stores = [
            PartitionStore(Path(d) / "decider" / f"p{i}", changelog)
            for i in range(app.settings.partitions)
        ]
        base = peak_rss_mb()
        t0 = time.perf_counter()
        recorded, _ = decide_into(app, decider, stores, keys)
        seconds = time.perf_counter() - t0
        stored = sum(1 for store in stores for _ in store.items())
        for store in stores:
            store.close()
    peak = peak_rss_mb()
    print(
        json.dumps(
            {
                "keys": keys,
                "stored_keys": stored,
                "idempotency_keys": recorded,
                "partitions": len(stores),
                "seconds": round(seconds, 1),
                "base_rss_mb": round(base, 1),
                "peak_rss_mb": round(peak, 1),
                "note": f"{recorded:,} idempotency keys in {len(stores)} rocksdict stores "
                f"({stored:,} states), decided in {seconds:,.0f} s; "
                f"{base:,.0f} MB before the first key",
            }
        )
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
