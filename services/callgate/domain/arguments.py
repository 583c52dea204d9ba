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
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError, best_match

from callgate.domain.catalog import Limits, ToolSpec
from callgate.domain.codes import Code, Rejection


def _reject(message: str, field: str = "") -> Rejection:
    return Rejection(Code.INVALID_ARGUMENTS, message, {"field": field} if field else {})


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Duplicate keys would let two parsers read different values from one text.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key '{key}'")
        out[key] = value
    return out


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_no_constant)


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Draft202012Validator:
    """One compiled validator per distinct schema text (normalization runs per call)."""
    return Draft202012Validator(json.loads(schema_json))


def _check_strings(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _reject("arguments contain an unpaired surrogate (not valid Unicode)") from exc


def _walk(value: Any, depth: int, limit: int) -> Any:
    """Check depth and Unicode; turn integral floats into ints (as canonical JSON does)."""
    if isinstance(value, dict):
        if depth > limit:
            raise _reject(f"arguments nest deeper than {limit} levels (limits.max_depth)")
        for key in value:
            _check_strings(key)
            value[key] = _walk(value[key], depth + 1, limit)
        return value
    if isinstance(value, list):
        if depth > limit:
            raise _reject(f"arguments nest deeper than {limit} levels (limits.max_depth)")
        return [_walk(v, depth + 1, limit) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        _check_strings(value)
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


def normalize_args(spec: ToolSpec, limits: Limits, args_json: str) -> dict[str, Any]:
    """Parse, bound, validate and normalize proposed arguments (C7, C8, C11).

    Order: size limit on the raw text, strict JSON parse (no NaN, no duplicate keys),
    must be an object, depth limit, JSON Schema (Draft 2020-12), then schema defaults.
    Raises ``Rejection(Code.INVALID_ARGUMENTS)`` naming the field or limit.
    """
    size = len(args_json.encode("utf-8", "surrogatepass"))
    if size > limits.max_args_bytes:
        raise _reject(
            f"arguments are {size} bytes; the limit is {limits.max_args_bytes} "
            "(limits.max_args_bytes)"
        )
    try:
        parsed = _DECODER.decode(args_json)
    except RecursionError as exc:
        raise _reject("arguments nest too deeply to parse (limits.max_depth)") from exc
    except ValueError as exc:
        raise _reject(f"arguments are not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise _reject(f"arguments must be a JSON object, got {type(parsed).__name__}")
    args: dict[str, Any] = _walk(parsed, 1, limits.max_depth)

    validator = _validator(spec.args_schema_key)
    # ``is_valid`` stops at the first error; ranking every error is only worth it to explain.
    error = None if validator.is_valid(args) else best_match(validator.iter_errors(args))
    if error is not None:
        path = _error_field(error)
        where = f"argument '{path}'" if path else "arguments"
        raise _reject(f"{spec.name}: {where}: {error.message}", path)
    _apply_defaults(spec.args_schema, args)
    return args


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
