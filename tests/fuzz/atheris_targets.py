"""Coverage-guided fuzzing of the decoders with atheris (libFuzzer for Python).

    python -m tests.fuzz.atheris_targets TARGET [libFuzzer flags, e.g. -runs=N] [CORPUS]

Each target feeds the fuzzer's bytes to one decoder that hostile input reaches first and
accepts exactly one kind of refusal from it; any other exception is a crash (a finding):

- ``avro``: ``AvroCodec.decode`` (a record on any topic): ``MalformedEvent`` only;
- ``token``: ``SessionVerifier.verify`` and ``ApprovalVerifier.verify`` (session tokens and
  approval ids, as text): ``Rejection`` only;
- ``args``: ``limits.parse_args`` over bytes and text, then ``normalize_args`` for a tool
  with free-form fields: ``Rejection`` only, and what passes must encode canonically;
- ``json``: the strict JSON reader (``limits.parse_json``, ``parse_document``) over bytes
  and text: ``Rejection`` (``ValueError`` for a document) only; whatever the standard
  library reads with a duplicate key, a non-finite number or a lone surrogate must be
  refused, bytes and their text get the same answer, and what passes round-trips through
  canonical JSON unchanged;
- ``mcp``: a JSON-RPC message as the MCP surface reads it (``strict_body.check_body``, then
  the MCP SDK's parsers over stdio and HTTP): the strict reader answers a coded refusal or
  passes, its JSON-RPC error is valid JSON, and what passes reads the same in the SDK's
  parser (no parser differential);
- ``state``: a ``requestState`` (the SDK's ``AESGCMRequestStateCodec.unseal``:
  ``InvalidRequestState`` only; ``rounds.Round.load`` of an opened state: ``ValueError``
  only, and what it accepts dumps and loads back to itself);
- ``form``: HTTP form bodies (``strict_body.read_form`` as the Slack route and the sign-in
  callback read them: ``ValueError`` only), the Slack interaction route's payload
  (``ApiError`` only), its click (``notices.slack_action``) and signature check
  (``SlackInteractions.verify``: ``Rejection`` only);
- ``config``: a ``callgate.toml`` (``load_settings``, then ``trusted_issuers`` over its
  ``[[sessions.issuers]]``) with one ``CALLGATE_*`` variable: ``ConfigError`` only, and no
  accepted setting holds a non-finite number;
- ``profile``: an adoption profile (``parse_profile``, YAML): ``ProfileError`` only, and no
  accepted profile holds a non-finite number.

``make fuzz-campaign`` (``tests.fuzz.campaign``) runs every target to a number of inputs
from a kept corpus (seeded by ``... seeds DIR`` where empty) and prints its figures;
``make fuzz-atheris`` is its short form; the suite runs a short smoke of each.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import atheris
import mcp.types as mcp_types
import pydantic
import pydantic_core
import yaml
from mcp.server.request_state import AESGCMRequestStateCodec, InvalidRequestState

# Instrument callgate's own modules only: instrumenting the libraries under them (pydantic,
# cryptography, importlib.metadata) crashes the interpreter here, and they are not ours.
with atheris.instrument_imports(include=["callgate", "callgate_projections"]):
    from callgate.adapters.avro_codec import AvroCodec, MalformedEvent
    from callgate.adapters.notify.slack import SlackInteractions
    from callgate.adapters.profiles import load_profile
    from callgate.config import ConfigError
    from callgate.config.key_material import trusted_issuers
    from callgate.config.sections import SlackSettings
    from callgate.domain.approvals import ApprovalVerifier
    from callgate.domain.arguments import normalize_args
    from callgate.domain.canonical import canonical_json
    from callgate.domain.catalog import (
        ProfileError,
        StrictYamlLoader,
        default_profile_path,
        parse_profile,
    )
    from callgate.domain.codes import Rejection
    from callgate.domain.identity import SessionIssuer, SessionVerifier
    from callgate.domain.keys import KeyRing
    from callgate.domain.limits import parse_args, parse_document, parse_json
    from callgate.domain.notices import SlackAction, slack_action
    from callgate.settings import Settings
    from callgate.surfaces.http.errors import ApiError
    from callgate.surfaces.http.routers.slack import SLACK_MAX_FIELDS
    from callgate.surfaces.http.routers.slack import _payload as slack_payload
    from callgate.surfaces.mcp.rounds import Round
    from callgate.surfaces.strict_body import check_body, jsonrpc_refusal, read_form

NOW_MS = 1_800_000_000_000
CODEC = AvroCodec.default()
RING = KeyRing.generate()
SESSIONS = SessionVerifier(RING.session_verification_keys())
APPROVALS = ApprovalVerifier(RING.approval_verification_keys())
PROFILE = load_profile(default_profile_path())
RECORDS = PROFILE.tool("records.update")
POLICY_TEXT = (default_profile_path().parent / "default.cedar").read_text(encoding="utf-8")
STATE_CODEC = AESGCMRequestStateCodec([b"\x07" * 32])
SLACK_SECRET = "fuzz-signing-secret"
SLACK = SlackInteractions(
    SlackSettings.model_construct(signing_secret=SLACK_SECRET, users=(), team_id="T1"),
    SessionIssuer(RING.session_signing_key, "slack"),
    lambda: NOW_MS,
)
# The one configuration file the ``config`` target rewrites (a tmpfs where there is one).
_SHM = Path("/dev/shm")
CONFIG_DIR = Path(tempfile.mkdtemp(prefix="callgate-fuzz-", dir=_SHM if _SHM.is_dir() else None))
CONFIG_FILE = CONFIG_DIR / "callgate.toml"
# The variables the ``config`` target sets, chosen by the input's first byte: structured
# (JSON, read by the strict reader) and plain ones.
CONFIG_VARIABLES = (
    "CALLGATE_SESSIONS__ISSUERS",
    "CALLGATE_SESSIONS",
    "CALLGATE_SLACK__USERS",
    "CALLGATE_KAFKA_CLIENT",
    "CALLGATE_TIMEOUT_S",
    "CALLGATE_NOTIFY__RETRY_DELAYS_S",
    "CALLGATE_SESSIONS__JWKS_REFRESH_S",
    "CALLGATE_DEV",
)


class Finding(AssertionError):
    """An inconsistency a target checks for (libFuzzer reports it as a crash)."""


def non_finite(value: Any) -> bool:
    """Whether ``value`` (plain values, pydantic models' dumps) holds a NaN or an infinity."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
    return False


def _lax_reading(text: str) -> tuple[Any, bool] | None:
    """What the standard library's lenient reader makes of ``text``: the value and whether
    it had a duplicate key; ``None`` when it refuses the text too."""
    duplicate = False

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal duplicate
        out = dict(items)
        duplicate = duplicate or len(out) != len(items)
        return out

    try:
        return json.loads(text, object_pairs_hook=pairs), duplicate
    except (ValueError, RecursionError):
        return None


def _surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _strict(entry: str | bytes) -> tuple[Any, Rejection | None]:
    try:
        return parse_json(entry), None
    except Rejection as r:
        return None, r


def avro(data: bytes) -> None:
    try:
        CODEC.decode(data)
    except MalformedEvent:
        return


def token(data: bytes) -> None:
    text = data.decode("utf-8", "surrogateescape")  # invalid bytes become lone surrogates
    for verify in (SESSIONS.verify, APPROVALS.verify):
        try:
            verify(text, NOW_MS)
        except Rejection:
            continue


def args(data: bytes) -> None:
    assert RECORDS is not None
    for entry in (data, data.decode("utf-8", "surrogateescape")):
        try:
            parse_args(entry)
        except Rejection:
            continue
    text = data.decode("utf-8", "replace")
    try:
        normalized = normalize_args(RECORDS, PROFILE.entry_limits, text)
    except Rejection:
        return
    canonical_json(normalized)  # what passes the limits is representable


def json_reader(data: bytes) -> None:
    value, refused = _strict(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        if refused is None:
            raise Finding("bytes that are not UTF-8 passed the strict reader") from None
        text = data.decode("utf-8", "surrogateescape")  # lone surrogates in text
        if _strict(text)[1] is None:
            raise Finding("text with a lone surrogate passed the strict reader") from None
        return
    from_text, refused_text = _strict(text)
    if (refused is None) != (refused_text is None) or (
        refused is not None
        and refused_text is not None
        and (refused.code, refused.details) != (refused_text.code, refused_text.details)
    ):
        raise Finding(f"bytes and their text answered differently: {refused} / {refused_text}")
    with contextlib.suppress(ValueError):  # a configuration or key document
        parse_document(data)
    lax = _lax_reading(text)
    if refused is not None:
        return
    if lax is None:
        raise Finding("the strict reader passed what the standard library refuses")
    lax_value, duplicate = lax
    if duplicate:
        raise Finding("a duplicate key passed the strict reader")
    if non_finite(lax_value) or non_finite(value):
        raise Finding("a non-finite number passed the strict reader")
    if _surrogate(lax_value) or _surrogate(value):
        raise Finding("a lone surrogate passed the strict reader")
    if value != from_text or lax_value != value:
        raise Finding("the strict reader read another value than the standard library")
    canonical = canonical_json(value)
    again, refused_again = _strict(canonical)
    if refused_again is not None or again != value or canonical_json(again) != canonical:
        raise Finding(f"{canonical!r} does not round-trip: {refused_again}")


def mcp(data: bytes) -> None:
    refused = check_body(data)
    if refused is not None:
        if refused.code.value != "invalid_request":
            raise Finding(f"a refused message answered {refused.code.value}")
        json.dumps(jsonrpc_refusal(refused, data), allow_nan=False)  # the answer is JSON
        return
    value = parse_json(data, max_bytes=len(data) + 1, max_depth=64)
    text = data.decode("utf-8")
    if check_body(text) is not None:
        raise Finding("a message passed as bytes and was refused as text")
    try:  # streamable HTTP: the SDK's own JSON reader after the strict one
        sdk_value = pydantic_core.from_json(data)
    except ValueError as exc:
        raise Finding(f"the SDK's reader refused what the strict reader passed: {exc}") from None
    if sdk_value != value or canonical_json(sdk_value) != canonical_json(value):
        raise Finding("the SDK's reader read another value than the strict reader")
    adapter = mcp_types.jsonrpc_message_adapter
    for stdio in (True, False):  # stdio reads the text; streamable HTTP the parsed value
        try:
            message = (
                adapter.validate_json(text, by_name=False)
                if stdio
                else adapter.validate_python(value, by_name=False)
            )
        except pydantic.ValidationError:
            continue
        params = getattr(message, "params", None)
        if (
            isinstance(params, dict)
            and isinstance(value, dict)
            and isinstance(value.get("params"), dict)
            and params.get("arguments") != value["params"].get("arguments")
        ):
            raise Finding("the SDK read other arguments than the strict reader")


def state(data: bytes) -> None:
    text = data.decode("utf-8", "surrogateescape")
    with contextlib.suppress(InvalidRequestState):
        STATE_CODEC.unseal(text)
    try:  # what an opened state holds (only callgate's own plaintext in service)
        loaded = Round.load(text)
    except ValueError:
        return
    if Round.load(loaded.dump()) != loaded:
        raise Finding(f"{loaded} does not round-trip")
    if STATE_CODEC.unseal(STATE_CODEC.seal(loaded.dump().encode())) != loaded.dump().encode():
        raise Finding("a sealed state does not open to itself")


def form(data: bytes) -> None:
    for encoding in ("utf-8", "ascii"):  # a body; the sign-in callback's query
        try:
            fields = read_form(data, SLACK_MAX_FIELDS, encoding)
        except ValueError:
            continue
        if len(fields) > SLACK_MAX_FIELDS:
            raise Finding(f"{len(fields)} fields passed a limit of {SLACK_MAX_FIELDS}")
    try:
        payload = slack_payload(data)
    except ApiError:
        payload = None
    if isinstance(payload, dict):
        action = slack_action(payload)
        if action is not None and not (
            isinstance(action, SlackAction)
            and isinstance(action.slack_user, str)
            and isinstance(action.invocation_id, str)
            and action.decision in ("grant", "deny")
        ):
            raise Finding(f"an ill-formed click: {action!r}")
    body, _, rest = data.partition(b"\n")
    timestamp, _, signature = rest.decode("utf-8", "surrogateescape").partition("\n")
    for ts in (timestamp, str(NOW_MS // 1000)):
        try:
            SLACK.verify(body, ts, signature)
        except Rejection:
            continue


def config(data: bytes) -> None:
    toml, _, variable = data.partition(b"\x00")
    CONFIG_FILE.write_bytes(toml)
    environ: dict[str, str] = {}
    if variable:
        name = CONFIG_VARIABLES[variable[0] % len(CONFIG_VARIABLES)]
        environ[name] = variable[1:].decode("utf-8", "surrogateescape")
    try:
        settings = Settings.from_env(config_file=CONFIG_FILE, environ=environ)
    except ConfigError:
        return
    if non_finite(settings.model_dump()):
        raise Finding("a non-finite number passed the configuration")
    try:
        trusted_issuers(settings)
    except ConfigError:
        return


def profile(data: bytes) -> None:
    try:
        text = data.decode("utf-8")  # load_profile reads UTF-8 (ProfileError otherwise)
    except UnicodeDecodeError:
        return
    try:
        parse_profile(text, Path("fuzz.yaml"), lambda _: POLICY_TEXT)
    except ProfileError:
        return
    if non_finite(yaml.load(text, Loader=StrictYamlLoader)):  # the loader parse_profile uses
        raise Finding("a non-finite number passed the profile")


TARGETS: dict[str, Callable[[bytes], None]] = {
    "avro": avro,
    "token": token,
    "args": args,
    "json": json_reader,
    "mcp": mcp,
    "state": state,
    "form": form,
    "config": config,
    "profile": profile,
}


def seeds() -> dict[str, list[bytes]]:
    """Valid inputs to start each target from (libFuzzer mutates them into hostile ones)."""
    from callgate.bootstrap import App, Settings
    from tests.attacks import TICKET, alg_none_token, build_proposal

    issuer_token = SessionIssuer(RING.session_signing_key, RING.session_kid).issue(
        "alice", "acme", ["support"], NOW_MS
    )
    proposal = build_proposal(issuer_token, "tickets.create", TICKET, NOW_MS, key="K")
    app = App(Settings(dev=True), clock=lambda: NOW_MS)
    object.__setattr__(app, "keys", RING)  # cached_property slot: this ring, no state dir
    return {
        "avro": [CODEC.encode(proposal)],
        "token": [issuer_token.encode(), alg_none_token(app, NOW_MS).encode()],
        "args": [
            b'{"record_id": "REC-1", "fields": {"a": [1, 2.5, "x"], "b": {"c": null}}}',
            b'{"record_id": "REC-1", "fields": {"n": 1e400, "s": "\\ud800"}}',
        ],
        "json": [
            b'{"a": [1, -2.5e-3, true, null, "x\\u00e9\\ud83d\\ude00"], "b": {"c": {}}}',
            b'{"a": 1, "\\u0061": 2}',
            b"[NaN, Infinity, -Infinity, 1e400, 12345678901234567890]",
            b'"\\ud800"',
            b"[[[[[[[[[0]]]]]]]]]",
        ],
        "mcp": [
            b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": '
            b'"records.update", "arguments": {"record_id": "REC-1", "fields": {"a": 1.5}}}}',
            b'{"jsonrpc": "2.0", "id": "x", "method": "initialize", "params": {'
            b'"protocolVersion": "2026-07-28", "capabilities": {}, "clientInfo": '
            b'{"name": "c", "version": "1"}}}',
            b'{"jsonrpc": "2.0", "method": "notifications/initialized"}',
            b'{"jsonrpc": "2.0", "id": 2, "result": {"content": []}}',
            b'{"jsonrpc": "2.0", "id": 3, "error": {"code": -32602, "message": "m"}}',
        ],
        "state": [
            Round("inv-1", NOW_MS, True).dump().encode(),
            STATE_CODEC.seal(Round("inv-2", NOW_MS).dump().encode()).encode(),
        ],
        "form": [
            b"payload="
            + _quote(
                b'{"type": "block_actions", "user": {"id": "U1"}, "team": '
                b'{"id": "T1"}, "actions": [{"action_id": "callgate_approve", "value": "inv-1"}]}'
            )
            + b"\n"
            + str(NOW_MS // 1000).encode()
            + b"\nv0=00",
            b"code=abc&state=xyz&iss=https%3A%2F%2Fidp",
        ],
        "config": [
            b'[sessions]\ndev_tokens = false\n[[sessions.issuers]]\nissuer = "https://idp"\n'
            b'jwks_file = "jwks.json"\ntenants = ["acme"]\naudience = "callgate"\n'
            b'[slack]\nbot_token = "xoxb-1"\nsigning_secret = "s"\nchannel = "C1"\n'
            b"\x00\x00" + b'[{"issuer": "https://x", "pem_files": {"k": "k.pem"}}]',
            b"[notify]\nretry_delays_s = [1.0, 5.0]\ntimeout_s = 2.5\n[[notify.webhooks]]\n"
            b'url = "https://h/x"\nsecret = "whsec_x"\n',
        ],
        "profile": [default_profile_path().read_bytes()],
    }


def _quote(data: bytes) -> bytes:
    from urllib.parse import quote_plus

    return quote_plus(data).encode()


def write_seeds(directory: Path) -> None:
    for name, inputs in seeds().items():
        (directory / name).mkdir(parents=True, exist_ok=True)
        for i, data in enumerate(inputs):
            (directory / name / f"seed-{i}").write_bytes(data)


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[1] == "seeds":
        write_seeds(Path(argv[2]))
        return
    if len(argv) < 2 or argv[1] not in TARGETS:
        raise SystemExit(f"usage: {argv[0]} {'|'.join(TARGETS)} [libFuzzer flags]")
    target = TARGETS[argv[1]]
    atheris.Setup([argv[0], *argv[2:]], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
