"""The I/O of ``callgate audit export``: the stored position, the output, the follow loop.

The formatting and the choice of records are pure (``callgate_projections.export``); this
module reads and writes. Order of a batch: the lines are written, flushed (and, to a file,
fsynced), then the position is stored (atomically: a temporary file renamed over the old
one). A crash between the two leaves lines the stored position does not count; appending to
the same ``--output`` file, the exporter reads the position the file itself reached and
takes the further of the two, so the file never holds a record twice. (To stdout nothing
can be read back: a crash in that window repeats that batch on the next run, each line
with the same CloudEvents ``id`` / OCSF ``metadata.uid``.) A line cut short by a crash is
cut off the file before appending.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from callgate.adapters.atomic_file import write_atomically
from callgate_projections.audit import GENESIS
from callgate_projections.export import (
    Resume,
    advance,
    format_line,
    line_hash,
    resume_of_lines,
    select,
    since_position,
)

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class ExportMisuse(ValueError):
    """The export was asked for something it must refuse (a bad name, ``--since`` on a
    named exporter that already has a position)."""


class PositionStore:
    """Named exporters' positions: one JSON file each under ``<state dir>/exporters``."""

    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / "exporters"

    def path(self, name: str) -> Path:
        if NAME.fullmatch(name) is None:
            raise ExportMisuse(
                f"exporter name {name!r}: letters, digits, '.', '_' or '-' (at most 64)"
            )
        return self.folder / f"{name}.json"

    def load(self, name: str) -> Resume | None:
        """The stored position, or None when the exporter has none yet."""
        path = self.path(name)
        if not path.exists():
            return None
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            raw = None
        position = raw.get("position") if isinstance(raw, dict) else None
        link = raw.get("link") if isinstance(raw, dict) else None
        if (
            not isinstance(position, dict)
            or not isinstance(link, str)
            or not all(isinstance(k, str) and type(v) is int for k, v in position.items())
        ):
            raise ExportMisuse(f"the stored position of exporter {name!r} is unreadable: {path}")
        return Resume(dict(position), link)

    def save(self, name: str, resume: Resume) -> None:
        path = self.path(name)
        self.folder.mkdir(parents=True, exist_ok=True)
        doc = {"name": name, "position": dict(sorted(resume.position.items())), "link": resume.link}
        write_atomically(path, json.dumps(doc).encode(), 0o644)


def _cut_partial_line(path: Path) -> None:
    """Drop a last line without its newline (a write a crash cut short)."""
    with path.open("rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


@dataclass
class Export:
    """One run of the exporter (``run``); ``stop`` ends a ``follow`` loop."""

    fmt: str
    read_records: Callable[[], Sequence[Mapping[str, Any]]]
    stdout: TextIO
    output: Path | None = None
    name: str | None = None
    store: PositionStore | None = None
    since_ms: int | None = None
    follow: bool = False
    poll_s: float = 1.0
    stop: threading.Event | None = None

    def starting_point(self, records: Sequence[Mapping[str, Any]]) -> Resume:
        """The stored position, moved on to where the output file got (it is ahead after a
        crash between writing and storing), then ``since_ms`` for chains not begun yet."""
        stored = None
        if self.name is not None:
            assert self.store is not None, "a named exporter needs a position store"
            stored = self.store.load(self.name)
            if stored is not None and self.since_ms is not None:
                raise ExportMisuse(
                    f"exporter {self.name!r} resumes from its stored position; "
                    "--since only starts a new one"
                )
        position = dict(stored.position) if stored else {}
        link = stored.link if stored else GENESIS
        if self.output is not None and self.output.exists():
            _cut_partial_line(self.output)
            with self.output.open(encoding="utf-8") as f:
                in_file = resume_of_lines(line.rstrip("\n") for line in f)
            if in_file.position:
                link = in_file.link
            for pk, seq in in_file.position.items():
                position[pk] = max(position.get(pk, 0), seq)
        if self.since_ms is not None:
            for pk, seq in since_position(records, self.since_ms).items():
                position.setdefault(pk, seq)
        return Resume(position, link)

    def run(self) -> int:
        """Export; returns how many records were written."""
        stop = self.stop or threading.Event()
        records = self.read_records()
        resume = self.starting_point(records)
        if self.name is not None and self.store is not None:
            self.store.save(self.name, resume)  # a --since start holds from now on
        sink = self.output.open("a", encoding="utf-8") if self.output else self.stdout
        written = 0
        try:
            while True:
                batch = select(records, resume.position)
                if batch:
                    lines, link = [], resume.link
                    for record in batch:
                        line = format_line(self.fmt, record, link)
                        lines.append(line + "\n")
                        link = line_hash(line)
                    sink.write("".join(lines))
                    sink.flush()
                    if self.output is not None:
                        os.fsync(sink.fileno())
                    resume = Resume(advance(resume.position, batch), link)
                    if self.name is not None and self.store is not None:
                        self.store.save(self.name, resume)
                    written += len(batch)
                if not self.follow or stop.wait(self.poll_s):
                    return written
                records = self.read_records()
        finally:
            if sink is not self.stdout:
                sink.close()
