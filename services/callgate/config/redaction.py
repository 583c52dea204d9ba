"""What ``callgate config check`` hides: the value of every key that names a secret."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"
_SECRET_WORDS = ("password", "secret", "token", "credential", "key.pem", "private", "headers")


def redacted(value: Any) -> Any:
    """``value`` (a JSON dump) with the value of every key that names a secret replaced."""
    if isinstance(value, Mapping):
        return {
            k: REDACTED
            if any(w in str(k).lower() for w in _SECRET_WORDS) and v not in (None, "", {})
            else redacted(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redacted(v) for v in value]
    return value
