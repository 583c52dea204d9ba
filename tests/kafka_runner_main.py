"""One toy process on Kafka as its own OS process, for the runner's SIGKILL test.

``python -m tests.kafka_runner_main --process module:attr ...``: the runner is built by the
composition root (``App.kafka_runner``), as ``callgate serve``'s workers build theirs; view
values are JSON text (toy processes' views have no published schema).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from callgate.adapters.view_codec import JsonViews
from callgate.bootstrap import Settings, bootstrap
from callgate.domain.process_port import Process
from callgate.gc_settings import apply_gc_settings


def load_process(ref: str) -> Process[Any]:
    """``"module:attr"`` -> a process (``attr`` is a class or factory called with no args)."""
    module, _, attr = ref.partition(":")
    process: Process[Any] = getattr(importlib.import_module(module), attr)()
    return process


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Run one toy process on Kafka.")
    parser.add_argument("--process", required=True, help="module:attr of the process")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--batch-timeout-ms", type=int, default=100)
    parser.add_argument("-X", dest="consumer", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    apply_gc_settings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    settings = Settings(
        state_dir=args.state_dir,
        bootstrap_servers=args.bootstrap_servers,
        topic_prefix=args.prefix,
        partitions=args.partitions,
        instance_id=args.instance_id,
    )
    runner = bootstrap(settings).kafka_runner(
        load_process(args.process),
        batch_size=args.batch_size,
        batch_timeout_ms=args.batch_timeout_ms,
        consumer_overrides=dict(item.split("=", 1) for item in args.consumer),
        views=JsonViews(),
    )
    runner.run(stop)


if __name__ == "__main__":
    main()
