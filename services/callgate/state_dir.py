"""Where callgate keeps its state when nobody says: the same answer from any directory.

Order (the first that applies wins): ``--state-dir``, then ``CALLGATE_STATE_DIR``, then
the nearest directory named ``.callgate`` in the current directory or one of its parents
(a project that ran ``mkdir .callgate`` keeps its own state, wherever inside it a command
runs), else the per-user directory ``$XDG_STATE_HOME/callgate`` (``~/.local/state/callgate``
when ``XDG_STATE_HOME`` is unset), as the XDG base directory specification asks of state.
The flag and the environment variable are handled by the caller; this module finds the
default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PROJECT_DIR_NAME = ".callgate"


def nearest_project_dir(start: Path) -> Path | None:
    """The nearest ``.callgate`` directory at ``start`` or above it, if any."""
    here = start.resolve()
    for folder in (here, *here.parents):
        candidate = folder / PROJECT_DIR_NAME
        if candidate.is_dir():
            return candidate
    return None


def user_state_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/callgate``, else ``~/.local/state/callgate`` (absolute)."""
    env = os.environ if env is None else env
    base = env.get("XDG_STATE_HOME", "")
    # The specification ignores a relative value: it would depend on the current directory.
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "state"
    return root / "callgate"


def default_state_dir(cwd: Path | None = None, env: Mapping[str, str] | None = None) -> Path:
    """The state directory when neither the flag nor ``CALLGATE_STATE_DIR`` names one."""
    return nearest_project_dir(cwd or Path.cwd()) or user_state_dir(env)
