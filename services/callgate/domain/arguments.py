"""Argument parsing, limits, schema validation and normalization (C7, C8, C11).

The model's arguments arrive as JSON text. ``normalize_args`` turns them into the one
normalized form that the policy sees (C7: the ACL runs only after this succeeds), that
the fingerprint hashes (C8) and that approvals bind (C11). Every failure is
``invalid_arguments``. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from copy import deepcopy
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import jsonschema_rs

from callgate.domain.catalog import EntryLimits, ToolSpec
from callgate.domain.codes import Code, Rejection
from callgate.domain.limits import MAX_SAFE_INTEGER, parse_args

if TYPE_CHECKING:  # imported when a refusal is explained: a tenth of a command's start-up
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import ValidationError


def _reject(message: str, field: str = "") -> Rejection:
    return Rejection(Code.INVALID_ARGUMENTS, message, {"field": field} if field else {})


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Draft202012Validator:
    """One validator per distinct schema text, to explain a refusal (its errors are
    ranked by ``best_match``)."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(schema_json))


@lru_cache(maxsize=256)
def _check(schema_json: str) -> jsonschema_rs.Draft202012Validator:
    """One compiled validator per distinct schema text for the check itself: the same
    draft with formats as annotations, about a hundred times quicker (ADR 0068)."""
    return jsonschema_rs.Draft202012Validator(json.loads(schema_json))


def _integral(value: Any) -> Any:
    """Integral floats within the exact integers of a double become ints (as canonical
    JSON writes them; larger ones stay floats, as it writes them too). Depth is bounded by
    ``parse_args`` already, so this walk cannot recurse without end."""
    if isinstance(value, dict):
        for key in value:
            value[key] = _integral(value[key])
        return value
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_SAFE_INTEGER:
        return int(value)
    return value


def _error_field(error: ValidationError) -> str:
    """The argument an error is about, as a /-separated path ("" for the whole object)."""
    path = [str(p) for p in error.absolute_path]
    instance, schema = error.instance, error.schema
    required = error.validator_value
    if error.validator == "required" and isinstance(instance, dict) and isinstance(required, list):
        missing = [n for n in required if n not in instance]
        path += missing[:1]
    elif error.validator == "additionalProperties" and isinstance(instance, dict):
        known = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
        path += [k for k in instance if k not in known][:1]
    return "/".join(path)


def _apply_defaults(schema: Mapping[str, Any], value: dict[str, Any]) -> None:
    """Fill schema ``default``s for missing properties, recursing into present objects."""
    for name, sub in schema.get("properties", {}).items():
        if not isinstance(sub, Mapping):
            continue
        if name not in value:
            if "default" in sub:
                value[name] = deepcopy(sub["default"])
        elif isinstance(value[name], dict):
            _apply_defaults(sub, value[name])


def normalize_args(spec: ToolSpec, limits: EntryLimits, args_json: str) -> dict[str, Any]:
    """Parse, bound, validate and normalize proposed arguments (C7, C8, C11).

    Order: the limits of every entry (``callgate.domain.limits.parse_args``: size, Unicode,
    depth, numbers, strict parse), then JSON Schema (Draft 2020-12), then schema defaults.
    Raises ``Rejection(Code.INVALID_ARGUMENTS)`` naming the field or limit.
    """
    parsed = parse_args(args_json, limits.max_args_bytes, limits.max_depth)
    args: dict[str, Any] = _integral(parsed)

    # The compiled check decides; the Python validator only explains a refusal (a refusal
    # it cannot explain still refuses).
    if _check(spec.args_schema_key).is_valid(args):
        _apply_defaults(spec.args_schema, args)
        return args
    from jsonschema.exceptions import best_match

    error = best_match(_validator(spec.args_schema_key).iter_errors(args))
    if error is None:
        raise _reject(f"{spec.name}: arguments fail the tool's schema", "")
    path = _error_field(error)
    where = f"argument '{path}'" if path else "arguments"
    # A tool with sensitive fields gets no message quoting a value (ADR 0035).
    why = f"fails '{error.validator}'" if spec.sensitive else error.message
    raise _reject(f"{spec.name}: {where}: {why}", path)


def target_of(spec: ToolSpec, args: Mapping[str, Any]) -> str:
    """The resource the call acts on (C7): the ``target_arg`` value as text.

    ``""`` when the tool creates a new resource (``target_arg: null``). A missing or
    non-scalar target is ``invalid_arguments`` (fail closed).
    """
    if spec.target_arg is None:
        return ""
    value = args.get(spec.target_arg)
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise _reject(
        f"{spec.name}: target argument '{spec.target_arg}' must be a non-empty string or integer",
        spec.target_arg,
    )
