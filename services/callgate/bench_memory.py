"""Peak RSS of a decider holding state for N idempotency keys (run as a subprocess).

The real decider decides N proposals, each with its own idempotency key, and its
per-key state goes to the same rocksdict partition store the Kafka runner uses
(written in batches, as the runner writes after each transaction). Peak RSS of the
whole process is reported.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from callgate.adapters.kafka.state import PartitionStore
from callgate.bench_core import mixed_proposals, peak_rss_mb
from callgate.bootstrap import Settings, bootstrap


def main(keys: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        app = bootstrap(Settings(state_dir=Path(d)))
        decider = app.decider()
        store = PartitionStore(Path(d) / "decider-0", "callgate.changelog.decider")
        batch: dict[str, bytes | None] = {}
        t0 = time.perf_counter()
        chunk = 10_000
        done = 0
        offset = 0
        while done < keys:
            for p in mixed_proposals(app, min(chunk, keys - done), seed=done + 1):
                blob = store.get(p.partition_key)
                state = decider.load_state(blob) if blob is not None else decider.initial_state()
                state, _ = decider.handle(state, p, app.clock())
                batch[p.partition_key] = decider.dump_state(state)
                if len(batch) >= 500:
                    offset += 1
                    store.apply(batch, offset, "")
                    batch = {}
            done += chunk
        if batch:
            store.apply(batch, offset + 1, "")
        seconds = time.perf_counter() - t0
        stored = sum(1 for _ in store.items())
        store.close()
    print(
        json.dumps(
            {
                "keys": keys,
                "stored_keys": stored,
                "seconds": round(seconds, 1),
                "peak_rss_mb": round(peak_rss_mb(), 1),
                "note": f"{stored:,} keys in rocksdict, decided in {seconds:,.0f} s",
            }
        )
    )


if __name__ == "__main__":
    main(int(sys.argv[1]))
