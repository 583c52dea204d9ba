"""Log lines on stderr: Python logging for callgate and for librdkafka (through it).

librdkafka writes its own log lines to stderr unless a client is given a Python logger
(``callgate.adapters.kafka.client.LIBRDKAFKA_LOG``); every client callgate makes gets
that logger, and this module decides whether its records are shown: only with ``-v``.
``--log-format json`` makes every line one JSON object (``time``, ``level``, ``logger``,
``message``), for log collectors.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Literal

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
