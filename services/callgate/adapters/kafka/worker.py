"""One callgate process on Kafka, as its own OS process (``callgate serve`` spawns these).

Settings come from the ``CALLGATE_*`` environment (the composition root builds the
process exactly as the embedded backend does); the process is chosen by name.
``CALLGATE_KAFKA_CONSUMER`` (``key=value,key=value``) adds consumer settings, like ``-X``,
so that ``callgate serve`` can hand them to every child: tests on tansu set
``session.timeout.ms=6000,heartbeat.interval.ms=500`` there, because tansu's group joins
take about ``session.timeout.ms`` (docs/contract.md "Known tansu gaps") and the default would keep a
restarted child away for about half a minute.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from pathlib import Path

from callgate import logs
from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.kafka.runner import KafkaRunner, ProducerFenced
from callgate.adapters.kafka.topics import Topics
from callgate.bootstrap import Settings, bootstrap
from callgate.logs import SettledLog

CONSUMER_ENV = "CALLGATE_KAFKA_CONSUMER"
LOG_FORMAT_ENV = "CALLGATE_LOG_FORMAT"
VERBOSE_ENV = "CALLGATE_VERBOSE"
# The process whose committed view records show each decision settling: with
# ``--report-settled`` (given by ``callgate serve``) its worker prints serve's line per
# settled decision.
SETTLED_REPORTER = "status-projection"


def kafka_state_dir(settings: Settings) -> Path:
    return settings.state_dir / "kafka-state"


def consumer_overrides(options: list[str]) -> dict[str, str]:
    """``CALLGATE_KAFKA_CONSUMER`` items, then ``-X`` items (which win)."""
    items = [i for i in os.environ.get(CONSUMER_ENV, "").split(",") if i.strip()]
    return dict(item.strip().split("=", 1) for item in [*items, *options])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one callgate process on Kafka.")
    parser.add_argument("process", help="process name, e.g. decider, executor")
    parser.add_argument("--instance-id", default="0")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--batch-timeout-ms", type=int, default=20)
    parser.add_argument(
        "--report-settled", action="store_true", help="a line per settled decision on stderr"
    )
    parser.add_argument("-X", dest="consumer", action="append", default=[], metavar="KEY=VALUE")
    ns = parser.parse_args(argv)
    # serve hands its -v and --log-format down (CALLGATE_VERBOSE, CALLGATE_LOG_FORMAT).
    log_format: logs.LogFormat = "json" if os.environ.get(LOG_FORMAT_ENV) == "json" else "text"
    verbosity = os.environ.get(VERBOSE_ENV, "0")
    logs.configure(int(verbosity) if verbosity.isdigit() else 0, log_format)
    settings = Settings.from_env()
    if not settings.bootstrap_servers:
        parser.error("CALLGATE_BOOTSTRAP_SERVERS is not set")
    app = bootstrap(settings)
    processes = {p.name: p for p in app.processes()}
    if ns.process not in processes:
        parser.error(f"unknown process {ns.process!r}; one of {sorted(processes)}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    runner = KafkaRunner(
        processes[ns.process],
        AvroCodec.default(),
        Topics(settings.topic_prefix, settings.partitions),
        settings.bootstrap_servers,
        ns.instance_id,
        kafka_state_dir(settings),
        app.clock,
        batch_size=ns.batch_size,
        batch_timeout_ms=ns.batch_timeout_ms,
        consumer_overrides=consumer_overrides(ns.consumer),
        on_views=(
            SettledLog(log_format) if ns.report_settled and ns.process == SETTLED_REPORTER else None
        ),
    )
    try:
        runner.run(stop)
    except ProducerFenced:
        return 3  # a newer instance took over: exit, never continue
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
