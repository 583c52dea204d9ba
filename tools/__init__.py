"""The repository's developer tools, outside the installed package (ADR 0025): the Apache
Kafka launcher (``make kafka``, the Kafka test tier), the benchmarks (``make bench``) and
the chaos run (``make chaos``). They use callgate; callgate never imports them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parent.parent  # the repository: ``tools`` is importable


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a ``python -m tools.X`` child: the repository on
    ``PYTHONPATH``, whatever the child's working directory."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.environ | {"PYTHONPATH": os.pathsep.join(paths)} | (extra or {})


def end_process(proc: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    """SIGTERM ``proc`` (a controlled shutdown), SIGKILL it after ``grace_s``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def exit_on_signal(signum: int, _frame: object) -> NoReturn:
    """A handler that turns SIGTERM into ``SystemExit``, so a campaign's ``finally`` stops
    what it started."""
    raise SystemExit(128 + signum)
