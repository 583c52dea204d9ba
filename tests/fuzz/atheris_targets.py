"""Coverage-guided fuzzing of the decoders with atheris (libFuzzer for Python).

    python -m tests.fuzz.atheris_targets avro|token|args [libFuzzer flags, e.g. -runs=N]

Each target feeds the fuzzer's bytes to one decoder that hostile input reaches first and
accepts exactly one kind of refusal from it; any other exception is a crash (a finding):

- ``avro``: ``AvroCodec.decode`` (a record on any topic): ``MalformedEvent`` only;
- ``token``: ``SessionVerifier.verify`` and ``ApprovalVerifier.verify`` (session tokens and
  approval ids, as text): ``Rejection`` only;
- ``args``: ``limits.parse_args`` over bytes and text, then ``normalize_args`` for a tool
  with free-form fields: ``Rejection`` only, and what passes must encode canonically.

``make fuzz-atheris`` writes seed inputs (``... seeds DIR``) and runs each target from them
for a bounded time; the suite runs a short smoke of each.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import atheris

# Instrument callgate's own modules only: instrumenting the libraries under them (pydantic,
# cryptography, importlib.metadata) crashes the interpreter here, and they are not ours.
with atheris.instrument_imports(include=["callgate", "callgate_projections"]):
    from callgate.adapters.avro_codec import AvroCodec, MalformedEvent
    from callgate.adapters.profiles import load_profile
    from callgate.domain.approvals import ApprovalVerifier
    from callgate.domain.arguments import normalize_args
    from callgate.domain.canonical import canonical_json
    from callgate.domain.catalog import default_profile_path
    from callgate.domain.codes import Rejection
    from callgate.domain.identity import SessionIssuer, SessionVerifier
    from callgate.domain.keys import KeyRing
    from callgate.domain.limits import parse_args

NOW_MS = 1_800_000_000_000
CODEC = AvroCodec.default()
RING = KeyRing.generate()
SESSIONS = SessionVerifier(RING.session_verification_keys())
APPROVALS = ApprovalVerifier(RING.approval_verification_keys())
PROFILE = load_profile(default_profile_path())
RECORDS = PROFILE.tool("records.update")


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


TARGETS: dict[str, Callable[[bytes], None]] = {"avro": avro, "token": token, "args": args}


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
    }


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
