"""``make bench-simulate``: ``callgate policy simulate`` throughput on a recorded history.

A history of ``--proposals`` calls (60% ticket reads, 40% refunds of varied amounts and
currencies, two tenants) is recorded once through the real embedded pipeline and kept
under ``~/.cache/callgate/bench-simulate/<n>`` (recording 100,000 takes minutes). The
timed part is ``Gateway.simulate`` with a candidate that forbids refunds over 500 EUR:
reading the log, deciding every recorded decision again, comparing. Prints one row.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from callgate.bootstrap import Settings
from callgate.domain import events as ev
from callgate.domain.canonical import partition_key
from callgate.domain.catalog import default_profile_path, load_profile
from callgate.domain.scope import OPERATOR_ROLE, bound_id
from callgate.surfaces.sdk import Gateway, connect

CANDIDATE_POLICY = """
@id("refunds-over-500-eur")
forbid (principal, action == Action::"refunds.issue", resource)
when { context.args.amount_cents > 50000 && context.args.currency == "EUR" };
"""
TARGET_PER_S = 20_000
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "callgate"


def proposals(gate: Gateway, n: int, seed: int) -> list[ev.ToolCallProposed]:
    rng = random.Random(seed)
    now = gate.app.clock()
    tokens = {
        t: gate.app.session_issuer.issue(f"agent-{t}", t, ["support"], now, ttl_seconds=86_400)
        for t in ("acme", "globex")
    }
    out = []
    for i in range(n):
        tenant = "acme" if rng.random() < 0.8 else "globex"
        token = tokens[tenant]
        inv = bound_id(token, str(uuid.UUID(int=rng.getrandbits(128))))
        key: str | None = None
        args: dict[str, object]
        if rng.random() < 0.6:
            tool, args = "tickets.read", {"ticket_id": f"T-{rng.randrange(10_000)}"}
        else:
            key = f"sim-{seed}-{i}"
            tool = "refunds.issue"
            args = {
                "order_id": f"ORD-{rng.randrange(10_000)}",
                "amount_cents": rng.choice([1_000, 20_000, 50_000, 60_000, 250_000]),
                "currency": rng.choice(["EUR", "USD"]),
                "issued_by": f"agent-{tenant}",
            }
        out.append(
            ev.ToolCallProposed(
                event_id=f"sim-{inv}",
                invocation_id=inv,
                partition_key=partition_key(tenant, key, inv),
                occurred_at=now,
                producer="bench-simulate",
                session_token=token,
                tool=tool,
                args_json=json.dumps(args),
                idempotency_key=key,
            )
        )
    return out


def recorded_history(n: int) -> Path:
    """A state directory holding ``n`` decided proposals (recorded once, then cached)."""
    state = CACHE / "bench-simulate" / str(n)
    if (state / "complete").exists():
        return state
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    gate = connect(Settings(state_dir=state, dev=True))
    try:
        batch = proposals(gate, n, seed=29)
        started = time.perf_counter()
        for at in range(0, n, 5_000):
            gate.backend.publish(batch[at : at + 5_000])
        last = batch[-1].invocation_id
        if not gate.backend.wait(lambda: gate.backend.view("status", last) is not None, 3_600):
            raise SystemExit("the history did not settle within an hour")
        print(f"recorded {n:,} proposals in {time.perf_counter() - started:,.0f} s")
    finally:
        gate.close()
    (state / "complete").touch()
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proposals", type=int, default=100_000)
    ns = parser.parse_args()
    state = recorded_history(ns.proposals)
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "default.yaml"
        shutil.copy(default_profile_path(), profile)
        cedar = default_profile_path().with_name("default.cedar").read_text(encoding="utf-8")
        profile.with_name("default.cedar").write_text(cedar + CANDIDATE_POLICY, encoding="utf-8")
        candidate = load_profile(profile)
    gate = connect(Settings(state_dir=state, dev=True))
    try:
        operator = gate.app.session_issuer.issue("bench", "ops", [OPERATOR_ROLE], gate.app.clock())
        cpu0, t0 = time.process_time(), time.perf_counter()
        report = gate.simulate(candidate, session=operator)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        gate.close()
    rate = report.decided / seconds
    verdict = "met" if rate >= TARGET_PER_S else "NOT met"
    print(f"{'policy simulate: recorded decisions decided again per s':<58} {rate:>10,.0f}/s")
    print(
        f"  {report.decided:,} decisions, {report.changed:,} would change, "
        f"{seconds:.2f} s wall, {cpu:.2f} s CPU in this process, "
        f"load average {os.getloadavg()[0]:.1f}; target ≥ {TARGET_PER_S:,}/s: {verdict}"
    )


if __name__ == "__main__":
    main()
