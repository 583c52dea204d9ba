"""Deciding a call makes no reference cycle (ADR 0021).

callgate's processes collect rarely (a young generation of 100,000 allocations), so
garbage that only the collector can free, a cycle per call, is held long enough to grow a
worker's memory under steady traffic (docs/explanation/soak.md "Resident memory"). The
check: the benchmark mix through every process of the embedded runner leaves nothing for
the collector.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tools.bench_core import mixed_proposals

from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.embedded.runner import EmbeddedRunner
from callgate.adapters.embedded.store import EmbeddedStore
from callgate.bootstrap import Settings, bootstrap

NOW = 1_800_000_000_000


def cycles_made_by(work: Callable[[], object]) -> list[object]:
    """What only the collector could free of what ``work`` left behind."""
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(flags | gc.DEBUG_SAVEALL)
    try:
        work()
        gc.collect()
        found = list(gc.garbage)
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
        gc.collect()  # the saved cycles, freed for real
    return found


def test_the_benchmark_mix_leaves_no_cycle_for_the_collector(tmp_path: Path) -> None:
    clock = [NOW]
    app = bootstrap(Settings(state_dir=tmp_path, dev=True), clock=lambda: clock[0])
    codec = AvroCodec.default()
    store = EmbeddedStore(tmp_path, codec)
    runner = EmbeddedRunner(store, app.processes(), codec, app.clock)
    assert runner.try_acquire()

    def decide(seed: int) -> None:
        for proposal in mixed_proposals(app, 150, seed=seed):
            clock[0] += 20
            store.append([proposal])
        runner.run_until_idle()

    try:
        decide(1)  # first uses make garbage once: lazy imports, the classes dataclasses replace
        found = cycles_made_by(lambda: decide(2))
    finally:
        runner.release()
    kinds = Counter(type(o).__name__ for o in found)
    functions = Counter(getattr(o, "__qualname__", "") for o in found if callable(o))
    assert not found, (len(found), kinds.most_common(8), functions.most_common(5))
