"""One callgate process on Kafka, as its own OS process (``callgate serve`` spawns these).

Settings come from the ``CALLGATE_*`` environment; the composition root builds the
process exactly as for the embedded backend (``callgate.surfaces.kafka_worker`` is the command that
passes it in: this adapter never imports the root); the process is chosen by name.
``CALLGATE_KAFKA_CONSUMER`` (``key=value,key=value``) adds consumer settings, like ``-X``,
so that ``callgate serve`` can hand them to every child: tests set
``session.timeout.ms=6000,heartbeat.interval.ms=500`` there (a SIGKILLed child's partitions
move to another member after ``session.timeout.ms``: a shorter one shortens the failover the
tests wait for); the runner's own defaults are ``consumer.GROUP_SETTINGS`` (ADR 0015).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from callgate import logs
from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.kafka.checkpoint import TRANSACTION_GAP_MS, ProducerFenced
from callgate.adapters.kafka.global_input import GlobalInput
from callgate.adapters.kafka.topics import Topics
from callgate.adapters.kafka.watchdog import Watchdog
from callgate.adapters.wiring import Wiring
from callgate.domain.process_port import ReadsControl
from callgate.gc_settings import apply_gc_settings
from callgate.logs import SettledLog
from callgate.settings import Settings
from callgate.stopping import stop_on_signals

CONSUMER_ENV = "CALLGATE_KAFKA_CONSUMER"
LOG_FORMAT_ENV = "CALLGATE_LOG_FORMAT"
VERBOSE_ENV = "CALLGATE_VERBOSE"
# The process whose committed view records show each decision settling: with
# ``--report-settled`` (given by ``callgate serve``) its worker prints serve's line per
# settled decision.
SETTLED_REPORTER = "status-projection"
PR_SET_PDEATHSIG = 1  # prctl(2)
SUPERVISOR_ENV = "CALLGATE_SUPERVISOR_PID"  # set by ``serve.worker_env``
EXIT_FENCED = 3  # the supervisor tells this exit from a crash (``serve.Supervisor``)
# A blocking client call outlived its bound (``watchdog``): the supervisor counts the stall
# and restarts the worker from the committed position.
EXIT_STALLED = 4
# Set by the supervisor for a worker it restarts: why the previous one ended.
RESTARTED_ENV = "CALLGATE_RESTARTED_AFTER"
# Processes no caller waits on, and how long each cycle collects records after its first
# (``KafkaRunner`` ``batch_linger_ms``): the audit trail is read by compliance, not by a
# call in flight, and it reacts to every event, so at low load it committed a transaction
# per event batch (docs/benchmarks.md, "Broker work per proposal"). The status, pending
# and decisions views are read by callers and approvers waiting on them: not held.
BATCH_LINGER_MS = {"audit-projection": 100.0}


def batch_linger_ms(process: str) -> float:
    """``process``'s linger (``BATCH_LINGER_MS``; 0 for a process a caller waits on)."""
    return BATCH_LINGER_MS.get(process, 0.0)


def kafka_state_dir(settings: Settings) -> Path:
    """This instance's state stores. Instances of one deployment may share the state
    directory (its keys and the simulated providers' ledger are the deployment's, not an
    instance's); each keeps its stores under its own id."""
    return settings.state_dir / "kafka-state" / settings.instance_id


# What the overrides may tune: group membership and fetching. Isolation, offsets and commits
# carry C8, C9 and C12 and stay the runner's own.
TUNABLE_PREFIXES = (
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "partition.assignment.strategy",
    "fetch.",
    "queued.",
    "socket.",
)


def consumer_overrides(options: list[str]) -> dict[str, str]:
    """``CALLGATE_KAFKA_CONSUMER`` items, then ``-X`` items (which win). Raises
    ``ValueError`` naming an item that is not ``key=value`` of a tunable key."""
    items = [i for i in os.environ.get(CONSUMER_ENV, "").split(",") if i.strip()]
    out: dict[str, str] = {}
    for item in [*items, *options]:
        key, sep, value = item.strip().partition("=")
        if not sep or not key.startswith(TUNABLE_PREFIXES):
            keys = ", ".join(p + "*" if p.endswith(".") else p for p in TUNABLE_PREFIXES)
            raise ValueError(
                f"{CONSUMER_ENV}/-X item {item.strip()!r}: expected key=value, key one of {keys}"
            )
        out[key] = value
    return out


def stop_with_parent() -> None:
    """Linux: SIGTERM this worker when its supervisor dies (a SIGKILLed ``callgate serve``
    takes its children along, as a lost host would, instead of leaving orphans that keep its
    partitions); a worker whose supervisor is already gone stops at once."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(os.environ.get(SUPERVISOR_ENV) or os.getppid()):
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor died before the prctl


def control_input(settings: Settings, process: ReadsControl) -> GlobalInput:
    """A process's global input: its control partitions of ``events`` (ADR 0064)."""
    return GlobalInput(
        settings.brokers,
        Topics(settings.topic_prefix, settings.partitions).physical("events"),
        keys=process.control_keys,
        partitions=settings.partitions,
        types=process.control_events,
        codec=AvroCodec.default(),
    )


def _float(text: str | None) -> float | None:
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def end_stalled(process: str) -> Callable[[str, float], None]:
    """The watchdog's action: say where the worker is stuck, then end it at once
    (``os._exit``: the stuck thread holds the client, so nothing may wait on it)."""

    def on_stall(step: str, waited_s: float) -> None:
        logging.getLogger("callgate.worker").error(
            "%s stalled: no progress for %.0f s in %s with work waiting; exiting so that "
            "the supervisor restarts it from the committed position",
            process, waited_s, step,
        )  # fmt: skip
        logging.shutdown()
        os._exit(EXIT_STALLED)

    return on_stall


def main(wire: Callable[[Settings], Wiring], argv: list[str] | None = None) -> int:
    """Run the named process until SIGTERM/SIGINT; ``wire`` is the composition root."""
    parser = argparse.ArgumentParser(description="Run one callgate process on Kafka.")
    parser.add_argument("process", help="process name, e.g. invocations, status-projection")
    parser.add_argument("--instance-id", help="default: CALLGATE_INSTANCE_ID, else the host")
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--batch-timeout-ms", type=int, default=20)
    parser.add_argument(
        "--transaction-gap-ms",
        type=float,
        default=TRANSACTION_GAP_MS,
        help="begin a transaction no sooner than this after the last commit "
        f"(default {TRANSACTION_GAP_MS}; docs/adr/0020-transaction-gap.md)",
    )
    parser.add_argument(
        "--batch-linger-ms",
        type=float,
        default=None,
        help="after a cycle's first record, collect this long before committing "
        "(default: 100 for the audit projection, 0 for the rest)",
    )
    parser.add_argument(
        "--report-settled", action="store_true", help="a line per settled decision on stderr"
    )
    parser.add_argument("-X", dest="consumer", action="append", default=[], metavar="KEY=VALUE")
    ns = parser.parse_args(argv)
    stop_with_parent()  # first: the supervisor may die while this worker starts
    apply_gc_settings()
    # serve hands its -v and --log-format down (CALLGATE_VERBOSE, CALLGATE_LOG_FORMAT).
    log_format: logs.LogFormat = "json" if os.environ.get(LOG_FORMAT_ENV) == "json" else "text"
    verbosity = os.environ.get(VERBOSE_ENV, "0")
    logs.configure(int(verbosity) if verbosity.isdigit() else 0, log_format)
    settings = Settings.from_env(instance_id=ns.instance_id)
    if not settings.bootstrap_servers:
        parser.error("CALLGATE_BOOTSTRAP_SERVERS is not set")
    app = wire(settings)
    processes = {p.name: p for p in app.processes()}
    if ns.process not in processes:
        parser.error(f"unknown process {ns.process!r}; one of {sorted(processes)}")
    process = processes[ns.process]
    before_batch: Callable[[], None] | None = None
    control: GlobalInput | None = None
    if isinstance(process, ReadsControl):
        reader, control = process, control_input(settings, process)
        reader.seed(control.catch_up())  # before it handles anything
        before_batch = lambda: reader.seed(control.poll())  # noqa: E731
    stop = threading.Event()
    stop_on_signals(stop)  # no lock in the handler
    watchdog = Watchdog(end_stalled(ns.process))
    watchdog.start()
    runner = app.kafka_runner(
        process,
        batch_size=ns.batch_size,
        batch_timeout_ms=ns.batch_timeout_ms,
        consumer_overrides=consumer_overrides(ns.consumer),
        transaction_gap_ms=ns.transaction_gap_ms,
        batch_linger_ms=(
            batch_linger_ms(ns.process) if ns.batch_linger_ms is None else ns.batch_linger_ms
        ),
        on_views=(
            SettledLog(log_format) if ns.report_settled and ns.process == SETTLED_REPORTER else None
        ),
        tracing=app.tracing,
        before_batch=before_batch,
        watchdog=watchdog,
        stalled_since=_float(os.environ.get(RESTARTED_ENV)),
    )
    try:
        runner.run(stop)
    except ProducerFenced as exc:
        # Another runner holds this transactional id (this instance restarted, or another
        # instance runs with the same id): exit at once, never continue.
        logging.getLogger("callgate.worker").error(
            "%s of instance %s fenced (%s): exiting", ns.process, settings.instance_id, exc
        )
        return EXIT_FENCED
    finally:
        if control is not None:
            control.close()
    return 0
