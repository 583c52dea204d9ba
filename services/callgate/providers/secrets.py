"""Where a provider's secret is read from: an environment variable or a file.

One shape for every secret of the provider configuration: an upstream's credential
(``credentials``) and the keys and client secrets of its token exchange (``upstream_token``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Secret(BaseModel):
    """Where a secret is read from: an environment variable or a file (one of them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    env: str | None = Field(default=None, min_length=1)
    file: Path | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Secret:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of 'env' and 'file'")
        return self

    def path(self, base: Path) -> Path:
        assert self.file is not None
        return self.file if self.file.is_absolute() else base / self.file

    def read(self, environ: Mapping[str, str], base: Path) -> str:
        if self.env is not None:
            value = environ.get(self.env, "")
            if not value:
                raise ValueError(f"environment variable {self.env} is not set")
            return value
        path = self.path(base)
        try:
            value = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
        if not value:
            raise ValueError(f"{path} is empty")
        return value
