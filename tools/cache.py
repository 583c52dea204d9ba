"""Where the developer tools keep what they fetch or build (jars, a distribution, a binary)."""

from __future__ import annotations

import os
from pathlib import Path


def tool_cache(name: str, env: str) -> Path:
    """``$<env>``, else ``$XDG_CACHE_HOME/callgate/<name>`` (``~/.cache`` by default)."""
    configured = os.environ.get(env)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "callgate" / name
