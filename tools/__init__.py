"""The repository's developer tools, outside the installed package (ADR 0025): the Apache
Kafka launcher (``make kafka``, the Kafka test tier), the benchmarks (``make bench``) and
the chaos run (``make chaos``). They use callgate; callgate never imports them."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository: ``tools`` is importable


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a ``python -m tools.X`` child: the repository on
    ``PYTHONPATH``, whatever the child's working directory."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.environ | {"PYTHONPATH": os.pathsep.join(paths)} | (extra or {})
