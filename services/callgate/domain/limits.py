"""Limits at every entry: one check of hostile JSON before any recursive parser or encoder.

Every surface that takes arguments from outside (the command line, the SDK, raw records on
the ``requests`` topic through the decider, and any HTTP or MCP surface) calls these plain
functions over the raw text or bytes, so the same input gets the same coded answer
(``invalid_arguments``) wherever it enters (docs/contract.md, "Limits at every entry").

Order, each step bounded by the previous one:

1. size in UTF-8 bytes (``max_bytes``), and the text must be valid Unicode (no lone
   surrogate, valid UTF-8 when bytes);
2. the strict parse by ``json``'s C decoder, whose hooks refuse duplicate keys (equal after
   unescaping), ``NaN``/``Infinity`` and number tokens over ``MAX_NUMBER_CHARS`` characters,
   integers outside I-JSON's exact range (``±(2**53 - 1)``, RFC 7493), other numbers not
   finite or with more than 17 significant digits (what an IEEE double keeps: two longer
   spellings could hash alike), so canonical JSON (RFC 8785) can represent them. The C
   decoder guards its own recursion (a 5000-deep bomb is a ``RecursionError``, refused);
3. nesting depth over the parsed value, and every string must encode as UTF-8 (an escaped
   lone surrogate such as ``"\\ud800"``).

``check_value`` applies the same limits to a Python value before the SDK encodes it.
Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from callgate.domain.codes import Code, Rejection

# Exact integers of an IEEE double (I-JSON, RFC 7493 section 2.2).
MAX_SAFE_INTEGER = 2**53 - 1
MAX_SIGNIFICANT_DIGITS = 17
MAX_NUMBER_CHARS = 64  # longer number tokens are refused before ``int``/``float`` see them
DEFAULT_MAX_BYTES = 16_384
DEFAULT_MAX_DEPTH = 8
# The largest record a client may put on a topic: librdkafka's default ``message.max.bytes``
# less room for the record overhead, so a record that passes here is never refused by the
# client library with a raw exception.
MAX_RECORD_BYTES = 1_000_000 - 4_096


def _reject(message: str, limit: str, field: str = "") -> Rejection:
    details = {"limit": limit}
    if field:
        details["field"] = field
    return Rejection(Code.INVALID_ARGUMENTS, message, details)


def _no_constant(name: str) -> Any:
    raise _reject(f"{name} is not valid JSON (no NaN or Infinity)", "syntax")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Duplicate keys would let two parsers read different values from one text (a parser
    differential). Keys arrive unescaped, so ``"a"`` and ``"\\u0061"`` are one key."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _reject(f"duplicate key {key!r}", "syntax", key)
            seen.add(key)
    return out


def _int(token: str) -> int:
    if len(token) > MAX_NUMBER_CHARS:
        raise _reject(
            f"a number of {len(token)} characters is longer than {MAX_NUMBER_CHARS}", "number"
        )
    value = int(token)
    if abs(value) > MAX_SAFE_INTEGER:
        raise _reject(
            f"integer {token} is outside the exact range ±{MAX_SAFE_INTEGER} (I-JSON)", "number"
        )
    return value


def _float(token: str) -> float:
    if len(token) > MAX_NUMBER_CHARS:
        raise _reject(
            f"a number of {len(token)} characters is longer than {MAX_NUMBER_CHARS}", "number"
        )
    value = float(token)
    check_float(value, token.lower().partition("e")[0])
    return value


# The one strict reader: the C decoder of ``json`` with hooks that refuse what I-JSON
# (RFC 7493) and the limits refuse. Numbers and duplicate keys are refused while parsing.
_DECODER = json.JSONDecoder(
    object_pairs_hook=_unique_keys,
    parse_constant=_no_constant,
    parse_int=_int,
    parse_float=_float,
)
# An escaped UTF-16 surrogate (``\\ud800``); only text containing one needs the walk
# that finds lone ones (raw lone surrogates are refused by ``as_text``).
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def as_text(data: str | bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """Step 1: the text of ``data``, within ``max_bytes`` UTF-8 bytes and valid Unicode."""
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
        if len(raw) > max_bytes:
            raise _size(len(raw), max_bytes)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _reject(f"arguments are not valid UTF-8: {exc.reason}", "unicode") from None
    if not isinstance(data, str):
        raise _reject(f"arguments must be JSON text, got {type(data).__name__}", "type")
    # Cheap upper bound first: no UTF-8 character is longer than 4 bytes.
    if len(data) * 4 > max_bytes:
        size = len(data.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise _size(size, max_bytes)
    try:
        data.encode("utf-8")
    except UnicodeEncodeError:
        raise _reject(
            "arguments contain an unpaired surrogate (not valid Unicode)", "unicode"
        ) from None
    return data


def _size(size: int, max_bytes: int) -> Rejection:
    return _reject(
        f"arguments are {size} bytes; the limit is {max_bytes} (entry_limits.max_args_bytes)",
        "max_args_bytes",
    )


def check_float(value: float, mantissa: str = "") -> None:
    if not math.isfinite(value):
        raise _reject("a number is too large to represent (not finite)", "number")
    digits = mantissa.lstrip("-+").replace(".", "").lstrip("0")
    if len(digits.rstrip("0")) > MAX_SIGNIFICANT_DIGITS:
        raise _reject(
            f"a number has more than {MAX_SIGNIFICANT_DIGITS} significant digits", "number"
        )
    if value == 0 and digits.strip("0"):
        raise _reject("a number is too small to represent (underflows to zero)", "number")


def _check_strings(value: Any, path: str) -> None:
    """Step 4: every key and string must be valid Unicode. Depth is already bounded."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            _encodable(item, where)
        elif isinstance(item, dict):
            for key, sub in item.items():
                _encodable(key, where)
                stack.append((sub, f"{where}.{key}" if where else key))
        elif isinstance(item, list):
            stack.extend((sub, f"{where}.{i}" if where else str(i)) for i, sub in enumerate(item))


def _encodable(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _reject(
            "arguments contain an unpaired surrogate (not valid Unicode)", "unicode", where
        ) from None


def parse_json(
    data: str | bytes, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = DEFAULT_MAX_DEPTH
) -> Any:
    """Any JSON value from hostile text or bytes, within the limits: the one strict reader
    of every entry (docs/contract.md, "Limits at every entry").

    Size and Unicode first (``as_text``); then ``json``'s C decoder, whose hooks refuse
    duplicate keys (after unescaping), ``NaN``/``Infinity`` and out-of-range numbers as it
    meets them; then nesting depth and escaped lone surrogates over the parsed value.
    """
    text = as_text(data, max_bytes)
    try:
        parsed = _DECODER.decode(text)
    except RecursionError:  # the C decoder's own guard against deep nesting
        raise _reject(
            f"arguments nest deeper than {max_depth} levels (entry_limits.max_depth)", "max_depth"
        ) from None
    except ValueError as exc:  # json.JSONDecodeError; Rejection is not a ValueError
        raise _reject(f"arguments are not valid JSON: {exc}", "syntax") from None
    _check_depth(parsed, max_depth)
    if _ESCAPED_SURROGATE.search(text):
        _check_strings(parsed, "")
    return parsed


def _check_depth(value: Any, max_depth: int) -> None:
    """Nesting of objects and arrays (the top-level one is 1), level by level over the
    parsed value: no recursion, one list comprehension per level."""
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            raise _reject(
                f"arguments nest deeper than {max_depth} levels (entry_limits.max_depth)",
                "max_depth",
            )
        level = [
            child
            for item in level
            for child in (item.values() if type(item) is dict else item)
            if type(child) is dict or type(child) is list
        ]


MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
MAX_DOCUMENT_DEPTH = 64


def parse_document(data: str | bytes) -> Any:
    """A configuration or key document (JSON in a setting, a JWKS file): the same strict
    reader, with room for documents (4 MiB, 64 levels). ``ValueError`` naming the problem."""
    try:
        return parse_json(data, MAX_DOCUMENT_BYTES, MAX_DOCUMENT_DEPTH)
    except Rejection as r:
        raise ValueError(r.message.replace("arguments", "the document", 1)) from None


def parse_args(
    data: str | bytes, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = DEFAULT_MAX_DEPTH
) -> dict[str, Any]:
    """Proposed arguments: a JSON object from hostile text or bytes, within the limits."""
    parsed = parse_json(data, max_bytes, max_depth)
    if not isinstance(parsed, dict):
        raise _reject(f"arguments must be a JSON object, got {type(parsed).__name__}", "type")
    return parsed


def check_value(
    value: Any, max_bytes: int = DEFAULT_MAX_BYTES, max_depth: int = DEFAULT_MAX_DEPTH
) -> str:
    """The same limits for a Python value about to be encoded (the SDK's ``args`` dict);
    returns its JSON text. Walks without recursion, so a cyclic or 10,000-deep value is
    refused instead of crashing the encoder."""
    if not isinstance(value, Mapping):
        raise _reject(f"arguments must be a JSON object, got {type(value).__name__}", "type")
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen = 0
    while stack:
        item, depth = stack.pop()
        seen += 1
        if seen > max_bytes:  # every value takes at least one byte of text
            raise _size(seen, max_bytes)
        if isinstance(item, Mapping | list | tuple):
            if depth > max_depth:
                raise _reject(
                    f"arguments nest deeper than {max_depth} levels (entry_limits.max_depth)",
                    "max_depth",
                )
            if isinstance(item, Mapping):
                for key in item:
                    if not isinstance(key, str):
                        raise _reject(f"object keys must be strings, got {key!r}", "type")
                    _encodable(key, "")
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if abs(item) > MAX_SAFE_INTEGER:
                raise _reject(
                    f"an integer is outside the exact range ±{MAX_SAFE_INTEGER} (I-JSON)",
                    "number",
                )
        elif isinstance(item, float):
            check_float(item, repr(item).lower().partition("e")[0])
        elif isinstance(item, str):
            _encodable(item, "")
        else:
            raise _reject(f"arguments cannot hold a {type(item).__name__}", "type")
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    as_text(text, max_bytes)
    return text


def check_text_field(name: str, value: str, max_bytes: int = MAX_RECORD_BYTES) -> None:
    """A free-text field of a request (tool name, keys, ids, token): valid Unicode and
    bounded, so the record can be encoded. A coded ``invalid_arguments`` otherwise."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        message = f"{name} is not valid Unicode (unpaired surrogate)"
        raise _reject(message, "unicode", name) from None
    if size > max_bytes:
        raise _reject(f"{name} is {size} bytes; the limit is {max_bytes}", "size", name)


def check_record_size(size: int, max_bytes: int = MAX_RECORD_BYTES) -> None:
    """A record about to be produced: refused with a code rather than by the client library."""
    if size > max_bytes:
        raise _reject(
            f"the request record is {size} bytes; the largest a topic takes is {max_bytes}",
            "record_bytes",
        )
