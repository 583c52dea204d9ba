"""The hostile-input corpus through the SDK on the embedded backend, plus raw poison bytes.

Same cases as ``tests/unit/test_attack_corpus.py`` (``tests/attacks.py``), but every
request goes through ``callgate.surfaces.sdk.connect(Settings(state_dir=...))`` into the SQLite
event store, and the deciders run in-process on the embedded runner. Bytes that are not
a valid request are appended as they came (``EmbeddedStore.append_raw``) and must be
dead-lettered (``malformed_event``, first in the order of checks (docs/contract.md)) with their
reason
and original bytes, while the stream goes on.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.attacks import (
    CORPUS,
    READ_T1,
    SETTLE_S,
    TICKET,
    AttackCase,
    Surface,
    Verdict,
    build_proposal,
    forged_execution,
    run_case,
    verdict_from_dead_letter,
    verdict_from_status,
)
from tests.harness import T0, write_profile

from callgate.adapters.avro_codec import MARKER, AvroCodec
from callgate.adapters.embedded.backend import EmbeddedBackend
from callgate.application.replay import replay
from callgate.bootstrap import Settings, bootstrap
from callgate.domain import events as ev
from callgate.domain.codes import Code, Rejection
from callgate.surfaces.sdk import Gateway, connect


class Clock:
    """A clock the test moves; the SDK, the deciders and the timers all read it."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


class EmbeddedSurface(Surface):
    """The attack surface over the SDK on the embedded backend."""

    def __init__(self, state_dir: Path) -> None:
        self.clock = Clock(T0)
        # The attacks on resubmitted approvals: the agent resubmits (ADR 0029 off).
        profile = write_profile(state_dir.parent / "resubmit-profile")
        settings = Settings(state_dir=state_dir, profile=profile, dev=True)
        self.gateway: Gateway = connect(settings, bootstrap(settings, clock=self.clock))
        backend = self.gateway.backend
        assert isinstance(backend, EmbeddedBackend)
        self.backend = backend
        super().__init__(self.gateway.app, self.clock)

    def sdk(self) -> Gateway:
        return self.gateway

    def submit(self, proposal: ev.ToolCallProposed, times: int = 1) -> Verdict:
        for _ in range(times):  # separate appends: the log holds the proposal twice
            self.backend.publish([proposal])
        inv = proposal.invocation_id
        ops = self.operator()
        settled = lambda: bool((self.gateway.status(inv, ops) or {}).get("settled"))  # noqa: E731
        self.backend.wait(settled, SETTLE_S)
        self.run_until_idle()  # deliver the duplicate too before anyone looks
        return verdict_from_status(inv, self.gateway.status(inv, ops))

    def decide(self, token: str, invocation_id: str, decision: str = "grant") -> Verdict:
        try:
            if decision == "grant":
                answer = self.gateway.approve(invocation_id, token, timeout_s=SETTLE_S)
                return Verdict(
                    invocation_id, "granted", details={"approval_id": answer["approval_id"]}
                )
            self.gateway.deny(invocation_id, token, timeout_s=SETTLE_S)
            return Verdict(invocation_id, "denied")
        except Rejection as r:
            return Verdict(invocation_id, r.code.value, r.message)

    def advance(self, ms: int) -> None:
        self.clock.now_ms += ms
        self.run_until_idle()

    def publish_raw(self, topic: str, partition_key: str, payload: bytes) -> Verdict:
        self.backend.store.append_raw(topic, partition_key, payload)
        self.run_until_idle()
        (dead,) = [d for d in self.dead_letters() if d.original == payload]
        return verdict_from_dead_letter(dead)

    def events_of(self, invocation_id: str) -> list[ev.Event]:
        return [e for e in self.backend.read_events() if e.invocation_id == invocation_id]

    def effects(self) -> list[dict[str, Any]]:
        return self.gateway.effects()

    # -- embedded only ------------------------------------------------------------------

    def run_until_idle(self) -> None:
        runner = self.backend.runner
        assert runner.try_acquire()
        try:
            runner.run_until_idle(max_seconds=SETTLE_S)
        finally:
            runner.release()

    def dead_letters(self) -> list[ev.EventDeadLettered]:
        rows = self.backend.store.read_log("dead-letter")
        decoded = [self.backend.codec.decode(row.payload) for row in rows]
        assert all(isinstance(d, ev.EventDeadLettered) for d in decoded)
        return [d for d in decoded if isinstance(d, ev.EventDeadLettered)]


@pytest.fixture
def surface(tmp_path: Path) -> Iterator[EmbeddedSurface]:
    s = EmbeddedSurface(tmp_path / "state")
    yield s
    s.gateway.close()


@pytest.mark.parametrize("case", CORPUS, ids=[c.name for c in CORPUS])
def test_attack_gets_its_code_and_runs_nothing(case: AttackCase, surface: EmbeddedSurface) -> None:
    """Each named attack through the SDK: its documented code, an unchanged ledger, no
    execution request for the attacking invocation, and the next call still decided."""
    v = run_case(surface, case)
    if case.wire:
        (dead,) = [d for d in surface.dead_letters() if d.original == v.original]
        assert (dead.code, dead.source_topic) == (Code.MALFORMED_EVENT.value, "requests")


def test_poison_is_dead_lettered_with_its_reason_and_the_stream_goes_on(
    surface: EmbeddedSurface,
) -> None:
    """malformed_event: random bytes, truncated Avro, an unknown schema fingerprint and a
    service event on the requests topic each become one EventDeadLettered with a reason
    and the original bytes; a valid proposal published after them is still decided."""
    codec = AvroCodec.default()
    alice = surface.session("alice")
    valid = codec.encode(build_proposal(alice, "tickets.create", TICKET, surface.now_ms))
    forged = forged_execution("forged", "inv-forged", "i-inv-forged")
    poison = {
        "marker": random.Random(7).randbytes(64),
        "corrupt ToolCallProposed": valid[:-7],
        "unknown schema fingerprint": MARKER + b"\x00" * 8 + valid[10:],
        "does not belong on topic requests": codec.encode(forged),
    }
    store = surface.backend.store
    for payload in poison.values():
        store.append_raw("requests", "i-poison", payload)
    # poison on the service topic too: every reader skips it, one dead-letter records it
    store.append_raw("events", "i-poison", b"\xc3\x01 not an event")

    after = surface.propose(alice, "tickets.create", TICKET)

    assert after.code == Code.EXECUTED.value
    dead = surface.dead_letters()
    assert len(dead) == len(poison) + 1
    rows = {row.seq: row for row in store.read_log()}
    for d in dead:
        assert d.code == Code.MALFORMED_EVENT.value
        assert rows[d.source_offset].payload == d.original  # exactly the bytes that came
        assert rows[d.source_offset].topic == d.source_topic
    requests = [d for d in dead if d.source_topic == "requests"]
    for reason, payload in poison.items():
        (d,) = [d for d in requests if reason in d.reason]
        assert d.original == payload
    assert [d.source_topic for d in dead].count("events") == 1
    assert [e["invocation_id"] for e in surface.effects()] == [after.invocation_id]
    assert not surface.events_of("inv-forged")
    # compliance replay skips what the runner dead-lettered, and rebuilds the same views
    assert replay(surface.gateway)["equal"] is True


def test_poison_between_two_attempts_of_one_key_does_not_break_replay(
    surface: EmbeddedSurface,
) -> None:
    """C8 across poison: the same partition key gets poison between a call and its retry;
    the retry still replays the stored result and nothing runs twice."""
    alice = surface.session("alice")
    first = surface.propose(alice, "tickets.create", TICKET, key="K")
    pk = surface.events_of(first.invocation_id)[0].partition_key
    surface.backend.store.append_raw("requests", pk, b"\xc3\x01\x00")
    retry = surface.propose(alice, "tickets.create", TICKET, key="K")
    read = surface.propose(alice, "tickets.read", READ_T1, key="K2")
    assert [first.code, retry.code, read.code] == ["executed", "replayed", "executed"]
    assert len(surface.effects()) == 1
    assert [d.partition_key for d in surface.dead_letters()] == [pk]
