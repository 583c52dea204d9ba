"""What ``callgate serve`` prints while it runs: one line per event, on stderr.

Lines: when it starts (the text form always contains ``callgate serve``), each attempt
to reach a broker that does not answer, one line per settled decision (time, invocation,
tool, outcome), and when it stops. ``--log-format json`` makes each line one JSON object
with ``time`` and ``event`` and the line's fields, for log collectors. On Kafka the status
projection's worker prints the decision lines (it sees them settle); they share serve's
stderr.
"""

from __future__ import annotations

import json
import sys
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

from callgate.surfaces.logs import LogFormat, iso_utc

STATUS_VIEW = "status"


def serve_line(log_format: LogFormat, event: str, message: str, **fields: Any) -> None:
    """``TIME MESSAGE`` (text) or ``{"time", "event", "message", **fields}`` (json)."""
    now = iso_utc(time.time())
    if log_format == "json":
        line = json.dumps({"time": now, "event": event, "message": message, **fields})
    else:
        line = f"{now} {message}"
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class _ViewRecord(Protocol):
    """``callgate.domain.process.ViewRecord`` as far as this module reads it."""

    @property
    def view(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def value(self) -> dict[str, Any] | None: ...


class SettledLog:
    """The observer of committed view records that prints each settled decision once.

    A status record is written again when a settled invocation's record changes (e.g. its
    audit fields), so the last printed outcome per invocation is remembered (bounded).
    """

    def __init__(self, log_format: LogFormat, remember: int = 100_000) -> None:
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
