"""Settings filled from their defaults, the configuration file, ``CALLGATE_*`` variables and
options, in that order of precedence, and validated; a refusal names where the bad value
came from (the file and key, the variable, or the option).
"""

from __future__ import annotations

import os
import tomllib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from callgate.config import ConfigError
from callgate.domain.limits import parse_document

if TYPE_CHECKING:
    pass

CONFIG_ENV = "CALLGATE_CONFIG"
CONFIG_FILE_NAME = "callgate.toml"
# Variables whose name is not CALLGATE_ + the key (``--timeout`` is ``timeout_s``).
ENV_ALIASES = {"CALLGATE_TIMEOUT": "CALLGATE_TIMEOUT_S"}
ENV_PREFIX = "CALLGATE_"

S = TypeVar("S", bound=BaseModel)


def config_file_for(
    state_dir: Path | None, environ: Mapping[str, str], explicit: Path | None
) -> Path | None:
    """``--config``, else ``CALLGATE_CONFIG``, else ``<state dir>/callgate.toml`` if present."""
    if explicit is not None:
        return explicit
    if value := environ.get(CONFIG_ENV):
        return Path(value)
    state = state_dir or Path(environ.get(f"{ENV_PREFIX}STATE_DIR") or ".callgate")
    candidate = state / CONFIG_FILE_NAME
    return candidate if candidate.is_file() else None


def _key_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _message(err: Mapping[str, Any]) -> str:
    return "unknown key" if err["type"] == "extra_forbidden" else str(err["msg"])


def _depth(raw: Mapping[str, Any], loc: tuple[int | str, ...]) -> int:
    """How many leading parts of ``loc`` (a validation error's location) ``raw`` holds."""
    node: Any = raw
    for depth, part in enumerate(loc):
        in_mapping = isinstance(node, Mapping) and part in node
        in_list = isinstance(node, list | tuple) and isinstance(part, int) and part < len(node)
        if not (in_mapping or in_list):
            return depth
        node = node[part]
    return len(loc)


def _variable(loc: tuple[int | str, ...]) -> str:
    names = []
    for part in loc:
        if isinstance(part, int):
            break
        names.append(str(part))
    return ENV_PREFIX + "__".join(names).upper()


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def _rebased(value: Any, base: Path) -> Any:
    """``value`` (a dump of the file's settings) with relative paths made relative to ``base``."""
    if isinstance(value, Path):
        return value if value.is_absolute() else base / value
    if isinstance(value, Mapping):
        return {k: _rebased(v, base) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rebased(v, base) for v in value]
    return value


def _environment(model: type[BaseModel], environ: Mapping[str, str]) -> dict[str, Any]:
    """The ``CALLGATE_*`` variables that name a key of ``model``, as nested values.

    Names are case-insensitive, nested keys are joined by ``__``, lists and tables are
    JSON, empty variables are not set; other ``CALLGATE_*`` variables are not keys
    (``CALLGATE_CONFIG``). Values stay text for the model to validate, so an error names
    the variable (``load_settings``).
    """
    values = {
        k.upper(): v for k, v in environ.items() if v != "" and k.upper().startswith(ENV_PREFIX)
    }
    for old, new in ENV_ALIASES.items():  # names older than the file
        if old in values:
            values.setdefault(new, values.pop(old))
    return _keys(model, ENV_PREFIX, values)


def _keys(model: type[BaseModel], prefix: str, values: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        variable = prefix + name.upper()
        if variable in values:
            out[name] = _decoded(variable, values[variable], field.annotation)
        section = _section(field.annotation)
        nested = _keys(section, variable + "__", values) if section is not None else {}
        if nested:
            whole = out.get(name)
            out[name] = _merge(whole, nested) if isinstance(whole, dict) else nested
    return out


def _decoded(variable: str, text: str, annotation: Any) -> Any:
    if not _structured(annotation):
        return text
    try:
        return parse_document(text)  # the one strict reader: no duplicate keys, no NaN
    except ValueError as exc:
        raise ConfigError(f"environment {variable}: not valid JSON: {exc}") from None


def _section(annotation: Any) -> type[BaseModel] | None:
    is_section = isinstance(annotation, type) and issubclass(annotation, BaseModel)
    return annotation if is_section else None


def _structured(annotation: Any) -> bool:
    """A list, a table or a section: given as JSON in a variable. (pydantic keeps a field's
    ``Annotated`` metadata apart from its annotation, so none arrives here.)"""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(_structured(a) for a in get_args(annotation) if a is not type(None))
    target = origin or annotation
    return isinstance(target, type) and issubclass(
        target, dict | list | tuple | set | frozenset | BaseModel
    )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"configuration {path}: cannot read: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration {path}: invalid TOML: {exc}") from None


def load_settings(
    cls: type[S],
    overrides: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> S:
    """Defaults < configuration file < ``CALLGATE_*`` < ``overrides`` (options), validated."""
    environ = os.environ if environ is None else environ
    given = {k: v for k, v in overrides.items() if v is not None}
    path = config_file_for(given.get("state_dir"), environ, config_file)
    file_values: dict[str, Any] = {}
    if path is not None:
        path = path.absolute()
        raw = _read_toml(path)
        try:
            parsed = cls.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigError(
                f"configuration {path}: key '{_key_path(first['loc'])}': {_message(first)}"
            ) from None
        file_values = _rebased(parsed.model_dump(exclude_unset=True), path.parent)
        file_values["config_file"] = path
    env_values = _environment(cls, environ)
    env_values.pop("config_file", None)  # set from CALLGATE_CONFIG / --config only
    merged = _merge(_merge(file_values, env_values), given)
    try:
        return cls.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = first["loc"]
        key = f"key '{_key_path(loc)}'"
        option, variable, in_file = (
            _depth(given, loc),
            _depth(env_values, loc),
            _depth(file_values, loc),
        )
        if option and option >= max(variable, in_file):
            where = f"option --{str(loc[0]).replace('_', '-')}"
        elif variable and variable >= in_file:
            where = f"environment {_variable(loc)}: {key}"
        elif path is not None:
            where = f"configuration {path}: {key}"
        else:
            where = f"settings: {key}"
        raise ConfigError(f"{where}: {_message(first)}") from None
