"""``callgate demo``: the contract end to end on a fresh state directory of its own.

On the embedded backend everything runs in this process. With ``--backend kafka`` the demo
runs on the broker it is given: it checks the broker answers (``broker_unavailable``
otherwise), starts ``callgate serve`` on topics of its own (``demo-<random>.*``), walks
through the same steps through the Kafka pipeline, then stops serve and deletes its topics.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from callgate.adapters.kafka.connection import BrokerAddress
from callgate.bootstrap import Settings
from callgate.domain.codes import Rejection
from callgate.domain.scope import OPERATOR_ROLE
from callgate.surfaces.render import Renderer, iso_ms, outcome_style
from callgate.surfaces.sdk import Gateway, connect

KAFKA_TIMEOUT_S = 60.0  # the first call waits for serve's processes to join their groups


def run_demo(settings: Settings, out: Renderer, keep: bool = False) -> int:
    """Runs in development mode whatever ``settings`` say: its sessions come from the
    development issuer, on a throwaway state directory of its own, on the backend
    ``settings`` name (module docstring)."""
    state_dir = Path(tempfile.mkdtemp(prefix="callgate-demo-"))
    demo: dict[str, Any] = {"state_dir": state_dir, "dev": True}
    try:
        if settings.backend == "kafka":
            demo["topic_prefix"] = f"demo-{uuid.uuid4().hex[:8]}"
            demo["timeout_s"] = max(settings.timeout_s, KAFKA_TIMEOUT_S)
        run = settings.model_copy(update=demo)
        with _kafka_serve(run, settings.timeout_s) if run.backend == "kafka" else _nothing():
            return _demo(run, out, keep)
    finally:
        if not keep:
            shutil.rmtree(state_dir, ignore_errors=True)


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextlib.contextmanager
def _kafka_serve(settings: Settings, probe_timeout_s: float) -> Iterator[None]:
    """``callgate serve`` on the demo's topics while the demo runs; the topics are deleted
    after it. Raises ``broker_unavailable`` at once when no broker answers."""
    from callgate.adapters.kafka.client import probe

    brokers = settings.brokers  # the servers and their connection properties
    bootstrap = brokers.servers
    probe(brokers, probe_timeout_s)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env |= {
        "CALLGATE_STATE_DIR": str(settings.state_dir),
        "CALLGATE_BACKEND": "kafka",
        "CALLGATE_BOOTSTRAP_SERVERS": bootstrap,
        "CALLGATE_TOPIC_PREFIX": settings.topic_prefix,
        "CALLGATE_PARTITIONS": str(settings.partitions),
        "CALLGATE_KAFKA_CLIENT": json.dumps(settings.kafka_client),
        "CALLGATE_DEV": "1",
    }
    if settings.profile is not None:
        env["CALLGATE_PROFILE"] = str(settings.profile)
    log = settings.state_dir / "serve.log"
    argv = [sys.executable, "-m", "callgate.surfaces.cli", "serve", "--instance-id", "demo"]
    with log.open("w") as err:
        serve = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
    try:
        requests = f"{settings.topic_prefix}.requests"
        deadline = time.monotonic() + KAFKA_TIMEOUT_S
        while requests not in probe(brokers, probe_timeout_s):  # serve creates the topics
            if serve.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"callgate serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield
    finally:
        if serve.poll() is None:
            serve.send_signal(signal.SIGTERM)
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                serve.kill()
                serve.wait()
        _delete_topics(brokers, settings.topic_prefix)


def _delete_topics(bootstrap: BrokerAddress, prefix: str) -> None:
    """Best effort: the demo's topics are throwaway, a broker gone meanwhile keeps them."""
    from callgate.adapters.kafka.client import make_admin

    admin = make_admin(bootstrap)
    with contextlib.suppress(Exception):
        mine = [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"{prefix}.")]
        for future in admin.delete_topics(mine, operation_timeout=30).values() if mine else ():
            future.result()


def _demo(settings: Settings, out: Renderer, keep: bool) -> int:
    gate = connect(settings)
    steps: list[dict[str, Any]] = []
    try:
        if settings.backend == "kafka" and not out.json_mode:
            where = f"{settings.bootstrap_servers}, topics {settings.topic_prefix}.*"
            out.console.print(f"on Kafka ({where}), through callgate serve\n")
        _walk(gate, out, steps)
        operator = gate.app.session_issuer.issue(
            "demo-operator", "demo", [OPERATOR_ROLE], gate.app.clock()
        )
        trail = gate.audit(session=operator)
        verified = gate.verify_audit()
        ok = verified.ok and all(s["ok"] for s in steps)
        if out.json_mode:
            summary = {
                "backend": settings.backend,
                "steps": steps,
                "audit_records": len(trail),
                "audit_ok": verified.ok,
            }
            out.value(summary, human=lambda c: None)
        else:
            out.console.rule("audit trail")
            out.audit(trail)
            chain = "[green]verified" if verified.ok else "[red]BROKEN"
            out.console.print(f"audit chain: {chain}[/] ({verified.records} records)")
            if keep:
                out.console.print(f"state: {settings.state_dir}")
        return 0 if ok else 1
    finally:
        gate.close()


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
    short, expires = approval["approval_id"][:24], iso_ms(approval["expires_at"])
    say(f"[green]✓[/] bob approves: approval_id {short}… (expires {expires})")
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
