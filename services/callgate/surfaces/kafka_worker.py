"""``python -m callgate.surfaces.kafka_worker <process>``: one callgate process on Kafka, as its own
OS process (``callgate serve`` spawns one per process). An entry point: it hands the
composition root to the worker adapter (``callgate.adapters.kafka.worker``)."""

from __future__ import annotations

from callgate.adapters.kafka import worker
from callgate.bootstrap import bootstrap


def main(argv: list[str] | None = None) -> int:
    return worker.main(bootstrap, argv)


if __name__ == "__main__":
    raise SystemExit(main())
