"""Sensitive argument fields: what views and every other output show instead of their values.

A catalog entry may name ``sensitive`` paths into its arguments (``card_number``,
``payment.card_number``: keys joined by dots). Their values stay on the log (the events
that bind an approval to the full arguments), but everything derived for people and other
systems shows a keyed digest instead: ``hmac-sha256:<64 hex>``, HMAC-SHA-256 under the
deployment's redaction key of the value's canonical JSON. The same value gives the same
digest, so two calls with one card can still be matched; without the key a digest cannot be
tested against guesses.

Three ways a value is kept out of a record (``Redactor``):

- ``args``: each sensitive path of the arguments is replaced by its digest;
- ``scrub``: in provider outputs, messages and targets derived from those arguments, each
  sensitive value is replaced wherever it appears (a whole value equal to it, or inside a
  text when the value is at least ``MIN_SCRUB_CHARS`` long), and so is the value of any key
  named like a sensitive field's last key;
- ``secrets``: the sensitive values of one call's arguments, which ``scrub`` takes.

Pure: the key is given (``callgate.domain.keys.redaction_key`` reads it).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from callgate.domain.canonical import canonical_json

PREFIX = "hmac-sha256:"
MIN_SCRUB_CHARS = 4  # shorter values are replaced only where they are a whole value


def split_path(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


@dataclass(frozen=True)
class Redactor:
    """The deployment's redaction: its key and, per tool, the sensitive paths."""

    key: bytes
    sensitive: Mapping[str, tuple[tuple[str, ...], ...]]

    def active(self, tool: str | None) -> bool:
        return bool(tool) and bool(self.sensitive.get(str(tool)))

    def digest(self, value: Any) -> str:
        text = canonical_json(value)
        return PREFIX + hmac.new(self.key, text.encode(), hashlib.sha256).hexdigest()

    def args(self, tool: str | None, args: Any) -> Any:
        """``args`` with every sensitive path's value replaced by its digest."""
        if not self.active(tool) or not isinstance(args, Mapping):
            return args
        out = _copy(args)
        for path in self.sensitive[str(tool)]:
            node: Any = out
            for name in path[:-1]:
                node = node.get(name) if isinstance(node, dict) else None
            if isinstance(node, dict) and path[-1] in node:
                node[path[-1]] = self.digest(node[path[-1]])
        return out

    def secrets(self, tool: str | None, args: Any) -> tuple[Any, ...]:
        """The values at the sensitive paths of ``args`` (nothing for another tool)."""
        if not self.active(tool) or not isinstance(args, Mapping):
            return ()
        found: list[Any] = []
        for path in self.sensitive[str(tool)]:
            node: Any = args
            for name in path:
                node = node.get(name) if isinstance(node, Mapping) else None
            if node is not None:
                found.append(node)
        return tuple(found)

    def scrub(self, tool: str | None, value: Any, secrets: Sequence[Any]) -> Any:
        """``value`` with every sensitive value (``secrets``) and every sensitively named
        key's value replaced by digests."""
        if not self.active(tool):
            return value
        names = {path[-1] for path in self.sensitive[str(tool)]}
        texts = [
            (s if isinstance(s, str) else canonical_json(s), self.digest(s))
            for s in secrets
            if not isinstance(s, bool)
        ]
        return _scrub(value, names, texts, self.digest)


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


def _scrub(value: Any, names: set[str], texts: list[tuple[str, str]], digest: Any) -> Any:
    if isinstance(value, Mapping):
        return {
            k: (
                v
                if isinstance(v, str) and v.startswith(PREFIX)
                else digest(v)
                if k in names and v is not None
                else _scrub(v, names, texts, digest)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_scrub(v, names, texts, digest) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        if value.startswith(PREFIX):
            return value
        for text, replacement in texts:
            if value == text:
                return replacement
            if len(text) >= MIN_SCRUB_CHARS and text in value:
                value = value.replace(text, replacement)
        return value
    text = canonical_json(value)
    for secret, replacement in texts:
        if text == secret:
            return replacement
    return value


def redactor_for(key: bytes, tools: Mapping[str, Sequence[str]]) -> Redactor:
    """A ``Redactor`` over the catalog's ``sensitive`` paths (tool name -> paths)."""
    return Redactor(
        key, {tool: tuple(split_path(p) for p in paths) for tool, paths in tools.items() if paths}
    )


NO_REDACTION = Redactor(b"", {})
