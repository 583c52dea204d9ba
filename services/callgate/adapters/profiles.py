"""Reading an adoption profile and its policy file from disk (the checking is the domain's:
``callgate.domain.catalog.parse_profile``)."""

from __future__ import annotations

from pathlib import Path

from callgate.domain.catalog import Profile, ProfileError, parse_profile


def load_profile(path: Path) -> Profile:
    """Load and check an adoption profile (C10); any problem raises ``ProfileError``."""
    return parse_profile(
        _read(path, "profile"), path, lambda policy: _read(policy, f"profile {path}: policy_file")
    )


def _read(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{what} {path}: cannot read: {exc}") from exc
