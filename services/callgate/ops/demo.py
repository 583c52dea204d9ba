"""``callgate demo``: the contract end to end on a fresh embedded state directory."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from callgate.bootstrap import Settings
from callgate.domain.codes import Rejection
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.render import Renderer, outcome_style
from callgate.surfaces.sdk import Gateway, connect


def run_demo(settings: Settings, out: Renderer, keep: bool = False) -> int:
    """Runs in development mode whatever ``settings`` say: its sessions come from the
    development issuer, on a throwaway state directory of its own."""
    state_dir = Path(tempfile.mkdtemp(prefix="callgate-demo-"))
    demo = {"state_dir": state_dir, "backend": "embedded", "dev": True}
    gate = connect(settings.model_copy(update=demo))
    steps: list[dict[str, Any]] = []
    try:
        _walk(gate, out, steps)
        operator = gate.app.session_issuer.issue(
            "demo-operator", "demo", [OPERATOR_ROLE], gate.app.clock()
        )
        trail = gate.audit(session=operator)
        verified = gate.verify_audit()
        ok = verified.ok and all(s["ok"] for s in steps)
        if out.json_mode:
            summary = {"steps": steps, "audit_records": len(trail), "audit_ok": verified.ok}
            out.value(summary, human=lambda c: None)
        else:
            out.console.rule("audit trail")
            out.audit(trail)
            chain = "[green]verified" if verified.ok else "[red]BROKEN"
            out.console.print(f"audit chain: {chain}[/] ({verified.records} records)")
            if keep:
                out.console.print(f"state: {state_dir}")
        return 0 if ok else 1
    finally:
        gate.close()
        if not keep:
            shutil.rmtree(state_dir, ignore_errors=True)


def _walk(gate: Gateway, out: Renderer, steps: list[dict[str, Any]]) -> None:
    now = gate.app.clock()
    issue = gate.app.session_issuer.issue
    alice = issue("alice", "acme", ["support"], now)
    bob = issue("bob", "acme", ["finance-approver"], now)

    def step(title: str, expect: str, answer: dict[str, Any]) -> dict[str, Any]:
        ok = answer["outcome"] == expect
        steps.append({"step": title, "expected": expect, "outcome": answer["outcome"], "ok": ok})
        if not out.json_mode:
            mark = "[green]✓[/]" if ok else "[red]✗[/]"
            code = answer["outcome"]
            out.console.print(f"{mark} {title}: [{outcome_style(code)}]{code}[/]")
            if "error" in answer:
                out.console.print(f"    {answer['error']['message']}")
        return answer

    def say(text: str) -> None:
        if not out.json_mode:
            out.console.print(text)

    say("[bold]callgate demo[/]: alice (support, acme) drives an agent;")
    say("bob is a finance approver.\n")
    step("C2 read a ticket", "executed", gate.propose(alice, "tickets.read", {"ticket_id": "T-1"}))
    step(
        "C12 forbidden call (support may not deploy)",
        "tool_forbidden",
        gate.propose(
            alice,
            "deploys.trigger",
            {"service": "billing", "version": "2.0.0", "environment": "production"},
        ),
    )
    step(
        "V1 the model names another requester",
        "identity_spoof",
        gate.propose(alice, "tickets.create", {"title": "refund please", "requester_id": "bob"}),
    )
    refund = {"order_id": "ORD-7", "amount_cents": 25000, "currency": "EUR"}
    first = step(
        "C4/C5 high-impact refund: dry-run, then approval",
        "approval_required",
        gate.propose(alice, "refunds.issue", refund, idempotency_key="refund-ORD-7"),
    )
    say(f"    dry-run the approver confirms: {first.get('dry_run')}")
    try:
        gate.approve(first["invocation_id"], alice)
        steps.append(
            {
                "step": "actor approves own call",
                "expected": "approver_forbidden",
                "outcome": "granted",
                "ok": False,
            }
        )
    except Rejection as r:
        steps.append(
            {
                "step": "actor approves own call",
                "expected": "approver_forbidden",
                "outcome": r.code.value,
                "ok": r.code.value == "approver_forbidden",
            }
        )
        say(f"[green]✓[/] alice may not approve her own refund: [red]{r.code.value}[/]")
    approval = gate.approve(first["invocation_id"], bob)
    short = approval["approval_id"][:24]
    say(f"[green]✓[/] bob approves: approval_id {short}… (expires {approval['expires_at']})")
    step(
        "C4 the approved call continues (ADR 0029)",
        "executed",
        gate.wait(first["invocation_id"], alice),
    )
    step(
        "V2 argument swap with the approval",
        "approval_mismatch",
        gate.propose(
            alice,
            "refunds.issue",
            {**refund, "amount_cents": 99000},
            idempotency_key="refund-ORD-7",
            approval_id=approval["approval_id"],
        ),
    )
    step(
        "C11 the approved call resubmitted with its approval",
        "replayed",
        gate.propose(
            alice,
            "refunds.issue",
            refund,
            idempotency_key="refund-ORD-7",
            approval_id=approval["approval_id"],
        ),
    )
    step(
        "C8 replay with the same key",
        "replayed",
        gate.propose(alice, "refunds.issue", refund, idempotency_key="refund-ORD-7"),
    )
    effects = [e for e in gate.effects() if e["target"] == "ORD-7"]
    ok = len(effects) == 1
    steps.append(
        {
            "step": "exactly one refund effect",
            "expected": "1",
            "outcome": str(len(effects)),
            "ok": ok,
        }
    )
    say(f"{'[green]✓' if ok else '[red]✗'}[/] side effects on ORD-7: {len(effects)}")
