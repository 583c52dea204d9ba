"""Canonical JSON, hashes and deterministic keys (C8, C11; docs/contract.md "Shape").

Everything that is hashed or bound (normalized arguments, request fingerprints,
approval bindings, partition keys, event ids) goes through ``canonical_json`` so
that two encodings of the same value always give the same bytes. The encoding
follows RFC 8785 (JCS) in spirit: object keys sorted by UTF-16 code units, no
insignificant whitespace, UTF-8 output, integral floats within the exact integers of a
double (``±(2**53 - 1)``, I-JSON) written as integers, larger ones as floats (``5.3e+55``:
the strict reader, ``callgate.domain.limits``, refuses integers past that range, so the
canonical text of a value it passed must read back as the same value), NaN and Infinity
refused. Pure: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import Any

import orjson

from callgate.domain.limits import MAX_SAFE_INTEGER

_ENCODER = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, separators=(",", ":"), check_circular=False
)
# The same encoder sorting keys itself (in C, by code point): used for "plain" values only.
_SORTING_ENCODER = json.JSONEncoder(
    ensure_ascii=False,
    allow_nan=False,
    separators=(",", ":"),
    check_circular=False,
    sort_keys=True,
)
# Leaves the C encoder writes exactly as ``_prepare`` + ``_ENCODER`` would (no float here:
# an integral float must become an int, so floats take the slow path).
_PLAIN_LEAVES = frozenset({str, int, bool, type(None)})


def _sorted_dumps(value: Any) -> str:
    """orjson writes plain values as ``_SORTING_ENCODER`` does, five times faster: same
    separators, same escapes (only ``"``, ``\\`` and U+0000-U+001F; checked for every
    code point by tests/unit/test_replay_fast.py), keys sorted by code point. What it
    cannot write (ints beyond 64 bits, lone surrogates, deep nesting) raises TypeError."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


_STATE_OPTIONS = (
    orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
)


def _utf16_key(key: str) -> bytes:
    # JCS orders keys by UTF-16 code units; differs from code-point order only above U+FFFF.
    return key.encode("utf-16-be", "surrogatepass")


def _prepare(value: object) -> Any:
    """Rebuild ``value`` with JCS key order and integral floats turned into ints."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:  # fast path: most values
        return value
    if isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"canonical JSON cannot encode {value!r}")
        return int(value) if value.is_integer() and abs(value) <= MAX_SAFE_INTEGER else value
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"canonical JSON object keys must be str, got {key!r}")
        # Code-point order equals UTF-16 order unless a key holds a character above U+FFFF,
        # so ASCII keys (nearly all) skip re-encoding each key: a hot spot of the projections.
        ascii_keys = "".join(value).isascii()
        order = sorted(value) if ascii_keys else sorted(value, key=_utf16_key)
        return {k: _prepare(value[k]) for k in order}
    if isinstance(value, list | tuple):
        return [_prepare(v) for v in value]
    raise TypeError(f"canonical JSON cannot encode {type(value).__name__}")


def _plain(value: Any) -> bool:
    """Whether ``_SORTING_ENCODER`` writes ``value`` exactly as the canonical form.

    True only for exact ``dict``/``list``/``tuple`` trees of exact ``str``/``int``/``bool``/
    ``None`` leaves whose object keys are exact ``str`` without characters above U+FFFF.
    For those, ``_prepare`` changes nothing but key order, and code-point order (the C
    encoder's ``sort_keys``) equals UTF-16 code-unit order (JCS): a BMP character is its
    own single code unit. Anything else (floats, other mappings, subclasses, odd keys)
    answers False and takes the reference path, which also raises the errors.
    """
    kind = type(value)
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return False
            if type(item) not in _PLAIN_LEAVES and not _plain(item):
                return False
        keys = "".join(value)
        return keys.isascii() or max(keys) <= "\uffff"
    if kind is list or kind is tuple:
        return all(type(item) in _PLAIN_LEAVES or _plain(item) for item in value)
    return kind in _PLAIN_LEAVES


def canonical_json(value: object) -> str:
    """The one canonical text of ``value`` (C8, C11): equal values give equal strings.

    Raises ``ValueError`` for NaN/Infinity and ``TypeError`` for non-JSON values or
    non-string object keys (silently stringifying keys could make two values collide).
    Plain values (``_plain``: the projections' views, nearly always) are sorted and written
    by a C encoder in one pass; the result is the same text as the reference path
    ``canonical_json_reference`` (tested with hypothesis), only without rebuilding ``value``.
    """
    if _plain(value):
        try:
            return _sorted_dumps(value)
        except TypeError:
            pass  # beyond orjson: the reference path writes it (or raises the error)
    return _ENCODER.encode(_prepare(value))


def is_plain(value: object) -> bool:
    """Whether ``plain_json`` may write ``value`` (see ``_plain``): then ``value`` built from
    plain parts and more ``str``/``int``/``bool``/``None`` leaves under ASCII keys is, too."""
    return _plain(value)


def plain_json(value: object) -> str:
    """``canonical_json(value)`` for a value known plain (``is_plain``), not checked again:
    for a caller that encodes one plain value more than once as it grows."""
    try:
        return _sorted_dumps(value)
    except TypeError:
        return _ENCODER.encode(_prepare(value))


def canonical_json_reference(value: object) -> str:
    """The canonical text built the straightforward way; ``canonical_json`` must equal it."""
    return _ENCODER.encode(_prepare(value))


def sha256_hex(data: str | bytes) -> str:
    """SHA-256 of ``data`` (strings are hashed as UTF-8), as 64 lowercase hex digits."""
    # surrogatepass: a hash of hostile text (a lone surrogate in an unverified claim used
    # for routing) is a hash like any other, not an exception; valid text is plain UTF-8.
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return hashlib.sha256(raw).hexdigest()


def state_json(value: Any) -> bytes:
    """Sorted-key compact JSON of a process state built of plain values: equal states give
    equal bytes, which is all a runner compares (not canonical JSON: nothing is hashed).

    orjson halved the decider's state dump (7.4% of the embedded runner's time before, 3.4%
    after; docs/benchmarks.md "CPU per record in the runners"). What orjson cannot write
    (an int beyond 64 bits) and what ``json`` would refuse (a dataclass, a datetime:
    orjson's passthrough hands them to ``json``, which raises ``TypeError``, never a silent
    encoding) goes to ``json``.
    """
    try:
        return orjson.dumps(value, option=_STATE_OPTIONS)
    except TypeError:
        return _SORTING_ENCODER.encode(value).encode()


def args_hash(normalized_args: Mapping[str, Any]) -> str:
    """Hash of the normalized arguments, bound into approvals (C11)."""
    return sha256_hex(canonical_json(normalized_args))


def request_fingerprint(tool: str, target: str, normalized_args: Mapping[str, Any]) -> str:
    """The request fingerprint an idempotency key is bound to (C8)."""
    return sha256_hex(canonical_json([tool, target, normalized_args]))


def partition_key(tenant: str, idempotency_key: str | None, invocation_id: str) -> str:
    """The partition key of an invocation (docs/contract.md "Shape", C8).

    Every attempt with one idempotency key in one tenant lands on one partition, so
    the replay/conflict check is partition-local. The tenant is part of the hash, so
    two tenants using the same key never share state. Without a key an invocation
    is keyed by its own id.
    """
    if idempotency_key is not None:
        return "k-" + sha256_hex(canonical_json([tenant, idempotency_key]))[:32]
    return "i-" + invocation_id


def execution_token(
    partition_key: str, fingerprint: str, invocation_id: str, idempotency_key: str | None
) -> str:
    """The deterministic idempotency token passed to providers (C12).

    With an idempotency key it depends only on (partition key, fingerprint): a retry
    after reconciliation, even from a new invocation, presents the same token, so the
    provider applies the effect at most once. Without a key it depends on the
    invocation id alone.
    """
    if idempotency_key is not None:
        return "xk-" + sha256_hex(canonical_json(["exec", partition_key, fingerprint]))[:32]
    return "xi-" + sha256_hex(canonical_json(["exec", invocation_id]))[:32]


def derive_id(*parts: str) -> str:
    """A deterministic id (32 hex digits) for event ids: same parts, same id."""
    return sha256_hex(canonical_json(list(parts)))[:32]
