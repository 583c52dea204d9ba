"""The hostile-input corpus (``tests/attacks.py``) on the in-memory Gate.

Every named attack runs against the real decider, executor, projections and simulated
providers (``tests.harness.Gate``) and must get its documented code, execute nothing
(provider ledger unchanged, no ``ExecutionRequested`` for the attacking invocation) and
leave the decider deciding (docs/contract.md "Vocabulary", C1-C12).

The in-memory runner carries Python objects, not bytes: its byte boundary is the Avro
codec that both durable runners decode with, so ``wire`` cases here prove the codec
refuses them with a reason. Topic admission (a service event written to ``requests``)
exists only where there are topics; that case runs on the embedded backend
(``tests/integration/test_hostile_embedded.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.attacks import (
    CORPUS,
    AttackCase,
    Surface,
    Verdict,
    run_case,
    verdict_from_decision,
    verdict_from_status,
)
from tests.harness import Gate

from callgate.adapters.avro_codec import AvroCodec, MalformedEvent
from callgate.domain import events as ev
from callgate.domain.codes import Code


class MemorySurface(Surface):
    """The attack surface over ``tests.harness.Gate`` (in-memory runner)."""

    def __init__(self, gate: Gate) -> None:
        super().__init__(gate.app, lambda: gate.runner.now_ms)
        self.gate = gate

    def submit(self, proposal: ev.ToolCallProposed, times: int = 1) -> Verdict:
        self.gate.runner.publish(*[proposal] * times)
        self.gate.runner.run()
        status = self.gate.runner.log.views.get("status", {}).get(proposal.invocation_id)
        return verdict_from_status(
            proposal.invocation_id, None if status is None else json.loads(status)
        )

    def decide(self, token: str, invocation_id: str, decision: str = "grant") -> Verdict:
        event_id = self.gate.decide(token, invocation_id, decision)
        answer = json.loads(self.gate.runner.log.views["decisions"][event_id])
        return verdict_from_decision(invocation_id, answer)

    def advance(self, ms: int) -> None:
        self.gate.runner.advance(ms)

    def publish_raw(self, topic: str, partition_key: str, payload: bytes) -> Verdict:
        try:
            event = AvroCodec.default().decode(payload)
        except MalformedEvent as exc:
            return Verdict("", Code.MALFORMED_EVENT.value, exc.reason, original=payload)
        raise AssertionError(f"the codec accepted hostile bytes as {event.event_type}")

    def events_of(self, invocation_id: str) -> list[ev.Event]:
        return self.gate.events_of(invocation_id)

    def effects(self) -> list[dict[str, Any]]:
        return self.gate.effects()


# Topic admission is a rule of the durable runners only: those cases run against the
# embedded store in tests/integration/test_hostile_embedded.py (the whole corpus).
IN_MEMORY = [c for c in CORPUS if not c.needs_topics]


@pytest.mark.parametrize("case", IN_MEMORY, ids=[c.name for c in IN_MEMORY])
def test_attack_gets_its_code_and_runs_nothing(case: AttackCase, tmp_path: Path) -> None:
    """Each named attack: its documented code, an unchanged ledger, no execution request
    for the attacking invocation, and a decider that still decides the next call."""
    run_case(MemorySurface(Gate(tmp_path / "state")), case)


def test_the_corpus_covers_every_rejection_the_brief_names() -> None:
    """The corpus is a fixed artifact: it keeps at least one attack per refusal code."""
    codes = {c.expected for c in CORPUS}
    assert codes >= {
        Code.MALFORMED_EVENT,
        Code.UNAUTHENTICATED,
        Code.UNKNOWN_TOOL,
        Code.INVALID_ARGUMENTS,
        Code.IDENTITY_SPOOF,
        Code.TOOL_FORBIDDEN,
        Code.APPROVAL_MISSING,
        Code.APPROVAL_EXPIRED,
        Code.APPROVAL_MISMATCH,
        Code.APPROVAL_CONSUMED,
        Code.APPROVER_FORBIDDEN,
        Code.IDEMPOTENCY_CONFLICT,
    }
