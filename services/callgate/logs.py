"""callgate's log lines on stderr: Python logging, and the lines ``callgate serve`` prints.

Logging: librdkafka writes its own log lines to stderr unless a client is given a Python
logger (``callgate.adapters.kafka.client.LIBRDKAFKA_LOG``); every client callgate makes
gets that logger, and ``configure`` decides whether its records are shown: only with
``-v``. ``--log-format json`` makes every line one JSON object (``time``, ``level``,
``logger``, ``message``), for log collectors.

Serve's lines (``serve_line``, ``SettledLog``, ``StorageLog``): when it starts (the text
form always contains ``callgate serve``), each attempt to reach a broker that does not
answer, when the disk refuses its writes and when it takes them again, one line per settled
decision (time, invocation, tool, outcome), and when it stops; with
``--log-format json`` each is a JSON object with ``time``, ``event``, ``message`` and the
line's fields. On Kafka the status projection's worker prints the decision lines (it sees
them settle); they share serve's stderr.

Imported by the command line and by the Kafka workers alike; imports nothing of callgate.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal, Protocol

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
# The logger confluent-kafka clients forward librdkafka's lines to (kept in sync with
# ``callgate.adapters.kafka.client``, which must not be imported here: it loads librdkafka).
LIBRDKAFKA_LOGGER = "callgate.librdkafka"


def iso_utc(epoch_s: float) -> str:
    """``2026-12-01T09:30:00.123Z``: ISO-8601 in UTC with milliseconds."""
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch_s))
    return f"{whole}.{int(epoch_s * 1000) % 1000:03d}Z"


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"{iso_utc(record.created)} {record.levelname.lower()} {record.name}: " + (
            record.getMessage()
        )


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "time": iso_utc(record.created),
                "level": record.levelname.lower(),
                "logger": record.name,
                "message": record.getMessage(),
            }
        )


def configure(verbosity: int, log_format: LogFormat) -> None:
    """Warnings of callgate always; librdkafka's lines and callgate's info only with ``-v``
    (``-vv``: debug)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if log_format == "json" else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    level = logging.DEBUG if verbosity >= 2 else logging.INFO if verbosity == 1 else None
    logging.getLogger("callgate").setLevel(level or logging.WARNING)
    # Without -v no librdkafka record is shown at all (not even its errors: the command
    # reports a coded error of its own, e.g. broker_unavailable).
    logging.getLogger(LIBRDKAFKA_LOGGER).setLevel(level or logging.CRITICAL + 1)


STATUS_VIEW = "status"


def serve_line(log_format: LogFormat, event: str, message: str, **fields: Any) -> None:
    """``TIME MESSAGE`` (text) or ``{"time", "event", "message", **fields}`` (json)."""
    now = iso_utc(time.time())
    if log_format == "json":
        line = json.dumps({"time": now, "event": event, "message": message, **fields})
    else:
        line = f"{now} {message}"
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except OSError:  # stderr on a full disk: the line is lost, never the server (ADR 0084)
        pass


class _ViewRecord(Protocol):
    """``callgate.domain.process_port.ViewRecord`` as far as this module reads it."""

    @property
    def view(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def value(self) -> dict[str, Any] | None: ...


class SettledLog:
    """The observer of committed view records that prints each settled decision once.

    A status record is written again when a settled invocation's record changes (e.g. its
    audit fields), so the last printed outcome per invocation is remembered: for the last
    10,000 settled, minutes of traffic, as such a change follows its settling within
    seconds (100,000 held about 25 MB and took over an hour at 25 calls/s to fill).
    """

    def __init__(self, log_format: LogFormat, remember: int = 10_000) -> None:
        self.log_format = log_format
        self.count = 0
        self._printed: OrderedDict[str, str] = OrderedDict()
        self._remember = remember

    def __call__(self, records: Sequence[_ViewRecord]) -> None:
        for record in records:
            if record.view != STATUS_VIEW:
                continue
            value = record.value
            if not value or not value.get("settled"):
                continue
            outcome = str(value.get("outcome"))
            if self._printed.get(record.key) == outcome:
                continue
            self._printed[record.key] = outcome
            if len(self._printed) > self._remember:
                self._printed.popitem(last=False)
            self.count += 1
            tool = str(value.get("tool"))
            serve_line(
                self.log_format,
                "settled",
                f"{record.key}  {tool}  {outcome}",
                invocation_id=record.key,
                tool=tool,
                outcome=outcome,
                at=iso_utc(int(value.get("updated_at") or 0) / 1000),
            )


class StorageLog:
    """Serve's lines while the disk under the embedded store refuses writes (ADR 0084): the
    first refusal, one line every ``every_s`` while they go on, and the recovery."""

    def __init__(self, log_format: LogFormat, every_s: float = 30.0) -> None:
        self.log_format = log_format
        self.every_s = every_s
        self._next = 0.0

    def refused(self, reason: str, attempt: int, retry_in_s: float) -> None:
        now = time.monotonic()
        if attempt > 1 and now < self._next:
            return
        self._next = now + self.every_s
        serve_line(
            self.log_format,
            "storage_unavailable",
            f"callgate serve: storage_unavailable: the disk refused a write ({reason}); "
            f"attempt {attempt}, next in {retry_in_s:g}s; work resumes once it has space",
            code="storage_unavailable",
            reason=reason,
            attempt=attempt,
            retry_in_s=retry_in_s,
        )

    def resumed(self, attempts: int, seconds: float) -> None:
        self._next = 0.0
        serve_line(
            self.log_format,
            "storage_recovered",
            f"callgate serve: the disk takes writes again after {seconds:.1f}s "
            f"({attempts} refused attempts); work resumes",
            attempts=attempts,
            refused_s=round(seconds, 3),
        )
