"""Providers (docs/contract.md "Providers", C12): simulated providers, effect ledger, faults, HTTP.

The simulations never deduplicate by token, so every "exactly one effect" assertion
elsewhere in the suite is a claim about callgate, not about the sims; these tests pin
that down together with the fault kinds the executor relies on.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tools.ports import free_port

from callgate.providers.base import (
    UPSTREAM_DATA_CHARS,
    UPSTREAM_MESSAGE_CHARS,
    Provider,
    ProviderError,
    ProviderTimeout,
    UpstreamRefused,
)
from callgate.providers.http import HttpProvider
from callgate.providers.ledger import EffectLedger
from callgate.providers.registry import ProviderRegistry
from callgate.providers.simulated import (
    CRASH_EXIT_CODE,
    DEFAULT_ORDER_TOTAL_CENTS,
    FaultPlan,
    RecordsProvider,
    RefundsProvider,
    derived_id,
)

T = "acme"  # tenant


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[EffectLedger]:
    led = EffectLedger.in_state_dir(tmp_path)
    yield led
    led.close()


def sims(ledger: EffectLedger, faults: dict[str, Any] | None = None) -> ProviderRegistry:
    return ProviderRegistry.simulated(ledger, faults or {})


REFUND = {"order_id": "o-1", "amount_cents": 2500, "currency": "EUR"}


# --- effect ledger -----------------------------------------------------------------------


def test_ledger_records_finds_and_lists_effects(ledger: EffectLedger) -> None:
    """C12: lookup reads the ledger; `callgate effects` lists tool, target, invocation, token."""
    row = ledger.apply(
        provider="p",
        tool="p.x",
        target="t1",
        tenant=T,
        token="k1",
        invocation_id="i1",
        args={"a": 1},
        result={"ok": True},
    )
    assert row["seq"] >= 1 and row["result"] == {"ok": True}
    assert ledger.find("k1") == row
    assert ledger.find("k1", provider="other") is None
    assert ledger.find("nope") is None
    assert ledger.count() == 1 and ledger.count("k1") == 1 and ledger.count("nope") == 0
    [listed] = ledger.effects()
    assert {k: listed[k] for k in ("tool", "target", "invocation_id", "token", "tenant")} == {
        "tool": "p.x",
        "target": "t1",
        "invocation_id": "i1",
        "token": "k1",
        "tenant": T,
    }
    assert listed["args"] == {"a": 1}
    assert ledger.effects(invocation_id="i2") == []


def test_ledger_effect_and_world_survive_reopen(tmp_path: Path) -> None:
    """The ledger is durable: a new process (a new ledger object) sees every effect."""
    first = EffectLedger.in_state_dir(tmp_path)
    sims(first).get("refunds").execute("refunds.issue", "o-1", REFUND, T, "k1", "i1")
    first.close()
    reopened = EffectLedger(tmp_path / "effects.sqlite")
    assert [e["token"] for e in reopened.effects()] == ["k1"]
    snapshot = sims(reopened).get("refunds").dry_run("refunds.issue", "o-1", REFUND, T).snapshot
    assert snapshot["refunded_cents"] == 2500
    reopened.close()


def test_ledger_failed_effect_function_records_nothing(ledger: EffectLedger) -> None:
    """A definite failure inside the write transaction leaves no effect and no world change."""

    def boom(txn: Any) -> dict[str, Any]:
        txn.put(("x",), 1)
        raise ProviderError("no")

    with pytest.raises(ProviderError):
        ledger.apply(
            provider="p",
            tool="p.x",
            target="t",
            tenant=T,
            token="k",
            invocation_id="i",
            args={},
            result=boom,
        )
    assert ledger.count() == 0 and ledger.world_get(("x",)) is None


def _refund_worker(path: str, worker: int, n: int, go: Any) -> None:
    led = EffectLedger(path)
    # 1 ms between transactions: SQLite's busy handler backs off, so without gaps one
    # writer can starve the other and the run would not interleave.
    refunds = ProviderRegistry.simulated(led, {"refunds": {"latency_ms": 1}}).get("refunds")
    go.wait(30)  # both writers start together, so they really contend
    for i in range(n):
        args = {"order_id": "o-shared", "amount_cents": 1, "currency": "EUR"}
        refunds.execute("refunds.issue", "o-shared", args, T, f"w{worker}-{i}", f"i{worker}-{i}")
    led.close()


def test_two_processes_writing_concurrently_lose_nothing(tmp_path: Path) -> None:
    """Concurrent writers: no lost effect rows and no lost read-modify-write of world state."""
    path, n = str(tmp_path / "effects.sqlite"), 200
    EffectLedger(path).close()  # create the schema before the race
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Barrier(2)
    procs = [ctx.Process(target=_refund_worker, args=(path, w, n, go)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    led = EffectLedger(path)
    effects = led.effects()
    assert len(effects) == 2 * n
    assert len({e["seq"] for e in effects}) == 2 * n
    assert {e["token"] for e in effects} == {f"w{w}-{i}" for w in (1, 2) for i in range(n)}
    assert RefundsProvider.order(led.world_get, T, "o-shared")["refunded_cents"] == 2 * n
    writers = [e["token"][:2] for e in effects]
    switches = sum(a != b for a, b in itertools.pairwise(writers))
    assert switches > 1, "the writers did not overlap, so this run proved nothing"
    led.close()


# --- simulated providers -----------------------------------------------------------------


def test_every_simulated_provider_implements_the_interface(ledger: EffectLedger) -> None:
    registry = sims(ledger)
    assert registry.names() == ["deploys", "records", "refunds", "tickets", "users"]
    assert all(isinstance(p, Provider) for p in registry)
    assert isinstance(HttpProvider("x", "http://127.0.0.1:1"), Provider)


def test_unknown_tool_is_a_definite_error(ledger: EffectLedger) -> None:
    refunds = sims(ledger).get("refunds")
    with pytest.raises(ProviderError):
        refunds.execute("deploys.trigger", "svc", {}, T, "k", "i")
    with pytest.raises(ProviderError):
        refunds.dry_run("refunds.nope", "o", {}, T)
    assert ledger.count() == 0


def test_tickets_read_and_create(ledger: EffectLedger) -> None:
    tickets = sims(ledger).get("tickets")
    read = tickets.execute("tickets.read", "T-9", {"ticket_id": "T-9"}, T, "r1", "i0").result
    assert read["ticket_id"] == "T-9" and read["synthetic"] is True
    assert ledger.count() == 0, "C2: a read applies no effect"

    args = {"title": "Printer on fire", "requester_id": "alice"}
    preview = tickets.dry_run("tickets.create", "", args, T).snapshot
    assert preview["would_create"]["title"] == "Printer on fire"
    created = tickets.execute("tickets.create", "", args, T, "tok-1", "i1").result
    assert created["ticket_id"] == derived_id("TKT", "tok-1")
    ticket_id = created["ticket_id"]
    again = tickets.execute("tickets.read", ticket_id, {"ticket_id": ticket_id}, T, "r2", "i2")
    assert again.result == created
    # Another tenant does not see it.
    other = tickets.execute(
        "tickets.read", ticket_id, {"ticket_id": ticket_id}, "other", "r3", "i3"
    )
    assert other.result.get("synthetic") is True


def test_simulated_execute_does_not_deduplicate_by_token(ledger: EffectLedger) -> None:
    """Deliberate: a duplicate execute is visible, so tests can prove callgate never does it."""
    tickets = sims(ledger).get("tickets")
    args = {"title": "t", "requester_id": "alice"}
    first = tickets.execute("tickets.create", "", args, T, "tok", "i1").result
    second = tickets.execute("tickets.create", "", args, T, "tok", "i1").result
    assert first["ticket_id"] == second["ticket_id"]
    assert ledger.count("tok") == 2
    assert tickets.lookup("tok").found


def test_records_dry_run_shows_before_and_after(ledger: EffectLedger) -> None:
    RecordsProvider.seed_record(ledger, T, "r-1", {"email": "old@x", "name": "Ann"})
    records = sims(ledger).get("records")
    args = {"record_id": "r-1", "fields": {"email": "new@x", "name": "Ann"}}
    snap = records.dry_run("records.update", "r-1", args, T).snapshot
    assert snap == {
        "record_id": "r-1",
        "before": {"email": "old@x", "name": "Ann"},
        "after": {"email": "new@x", "name": "Ann"},
        "changed": ["email"],
    }
    assert ledger.count() == 0, "C5: a dry-run is read-only"
    result = records.execute("records.update", "r-1", args, T, "k", "i").result
    assert result["fields"] == {"email": "new@x", "name": "Ann"}
    again = records.dry_run("records.update", "r-1", args, T).snapshot
    assert again["before"]["email"] == "new@x" and again["changed"] == []


def test_refunds_dry_run_and_execute(ledger: EffectLedger) -> None:
    RefundsProvider.seed_order(ledger, T, "o-1", total_cents=10_000, currency="EUR")
    refunds = sims(ledger).get("refunds")
    snap = refunds.dry_run("refunds.issue", "o-1", REFUND, T).snapshot
    assert snap == {
        "order_id": "o-1",
        "amount_cents": 2500,
        "currency": "EUR",
        "order_total_cents": 10_000,
        "refunded_cents": 0,
        "refundable_cents": 10_000,
        "refundable_after_cents": 7500,
    }
    result = refunds.execute("refunds.issue", "o-1", REFUND, T, "k1", "i1").result
    assert result["refund_id"] == derived_id("RF", "k1") and result["refundable_cents"] == 7500
    assert refunds.dry_run("refunds.issue", "o-1", REFUND, T).snapshot["refundable_cents"] == 7500

    too_much = {**REFUND, "amount_cents": 7501}
    with pytest.raises(ProviderError, match="exceeds refundable"):
        refunds.dry_run("refunds.issue", "o-1", too_much, T)
    with pytest.raises(ProviderError, match="exceeds refundable"):
        refunds.execute("refunds.issue", "o-1", too_much, T, "k2", "i2")
    with pytest.raises(ProviderError, match="USD"):
        refunds.execute("refunds.issue", "o-1", {**REFUND, "currency": "USD"}, T, "k3", "i3")
    assert [e["token"] for e in ledger.effects()] == ["k1"], "failures apply no effect"


def test_unseeded_order_takes_the_first_refunds_currency(ledger: EffectLedger) -> None:
    refunds = sims(ledger).get("refunds")
    snap = refunds.dry_run("refunds.issue", "o-new", REFUND, T).snapshot
    assert snap["order_total_cents"] == DEFAULT_ORDER_TOTAL_CENTS
    refunds.execute("refunds.issue", "o-new", {**REFUND, "order_id": "o-new"}, T, "k", "i")
    with pytest.raises(ProviderError):
        refunds.dry_run(
            "refunds.issue", "o-new", {**REFUND, "order_id": "o-new", "currency": "USD"}, T
        )


def test_deploys_dry_run_shows_current_to_new_version(ledger: EffectLedger) -> None:
    deploys = sims(ledger).get("deploys")
    args = {"service": "api", "version": "1.2.0", "environment": "prod"}
    snap = deploys.dry_run("deploys.trigger", "api", args, T).snapshot
    assert (snap["current_version"], snap["new_version"]) == (None, "1.2.0")
    result = deploys.execute("deploys.trigger", "api", args, T, "k", "i").result
    assert result["previous_version"] is None and result["version"] == "1.2.0"
    snap = deploys.dry_run("deploys.trigger", "api", {**args, "version": "1.3.0"}, T).snapshot
    assert (snap["current_version"], snap["new_version"]) == ("1.2.0", "1.3.0")


def test_users_delete(ledger: EffectLedger) -> None:
    users = sims(ledger).get("users")
    args = {"user_id": "bob"}
    assert users.dry_run("users.delete", "bob", args, T).snapshot["state"] == "active"
    assert users.execute("users.delete", "bob", args, T, "k", "i").result["previous_state"] == (
        "active"
    )
    assert users.dry_run("users.delete", "bob", args, T).snapshot["state"] == "deleted"
    assert users.lookup("k") == users.lookup("k") and users.lookup("k").found
    assert not users.lookup("other").found


def test_lookup_is_scoped_to_the_provider(ledger: EffectLedger) -> None:
    registry = sims(ledger)
    registry.get("refunds").execute("refunds.issue", "o-1", REFUND, T, "k", "i")
    assert registry.get("refunds").lookup("k").found
    assert not registry.get("deploys").lookup("k").found


_DRY_RUNS = st.one_of(
    st.builds(
        lambda rid, fields: ("records", "records.update", {"record_id": rid, "fields": fields}),
        st.sampled_from(["r-1", "r-2"]),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 3), max_size=3),
    ),
    st.builds(
        lambda oid, amt: (
            "refunds",
            "refunds.issue",
            {**REFUND, "order_id": oid, "amount_cents": amt},
        ),
        st.sampled_from(["o-1", "o-2"]),
        st.integers(1, 5000),
    ),
    st.builds(
        lambda v: (
            "deploys",
            "deploys.trigger",
            {"service": "s", "version": v, "environment": "e"},
        ),
        st.sampled_from(["1", "2"]),
    ),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(calls=st.lists(_DRY_RUNS, min_size=1, max_size=6), probe=_DRY_RUNS)
def test_dry_run_is_read_only_and_deterministic(
    ledger: EffectLedger, calls: list[tuple[str, str, dict[str, Any]]], probe: Any
) -> None:
    """C5: for a given world state, a dry-run returns the same snapshot and changes nothing."""
    registry = sims(ledger)
    for n, (provider, tool, args) in enumerate(calls):  # move the world to some state
        registry.get(provider).execute(tool, "t", args, T, f"tok-{ledger.count()}-{n}", "i")
    provider, tool, args = probe
    before = (ledger.count(), registry.get(provider).dry_run(tool, "t", args, T))
    again = (ledger.count(), registry.get(provider).dry_run(tool, "t", args, T))
    assert before == again


# --- fault injection ---------------------------------------------------------------------


def test_timeout_after_apply_leaves_exactly_one_effect_found_by_lookup(
    ledger: EffectLedger,
) -> None:
    """C12: the effect exists although the caller saw a timeout; lookup reconciles it."""
    refunds = sims(ledger, {"refunds": {"timeout_after_apply": 1.0}}).get("refunds")
    with pytest.raises(ProviderTimeout):
        refunds.execute("refunds.issue", "o-1", REFUND, T, "tok", "inv")
    assert ledger.count("tok") == 1
    found = refunds.lookup("tok")
    assert found.found and found.result is not None
    assert found.result["refund_id"] == derived_id("RF", "tok")


def test_timeout_before_apply_leaves_no_effect(ledger: EffectLedger) -> None:
    refunds = sims(ledger, {"refunds": {"timeout_before_apply": 1.0}}).get("refunds")
    with pytest.raises(ProviderTimeout):
        refunds.execute("refunds.issue", "o-1", REFUND, T, "tok", "inv")
    assert ledger.count() == 0
    assert refunds.lookup("tok").found is False


def test_fail_raises_provider_error_without_effect(ledger: EffectLedger) -> None:
    registry = sims(ledger, {"*": {"fail": 1.0}, "deploys": {}})
    with pytest.raises(ProviderError):
        registry.get("refunds").execute("refunds.issue", "o-1", REFUND, T, "tok", "inv")
    assert ledger.count() == 0
    args = {"service": "s", "version": "1", "environment": "e"}
    registry.get("deploys").execute("deploys.trigger", "s", args, T, "tok2", "inv2")
    assert ledger.count() == 1, "an explicitly named provider overrides '*'"


def test_fail_dry_run(ledger: EffectLedger) -> None:
    refunds = sims(ledger, {"refunds": {"fail_dry_run": 1.0}}).get("refunds")
    with pytest.raises(ProviderError):
        refunds.dry_run("refunds.issue", "o-1", REFUND, T)


def test_latency(ledger: EffectLedger) -> None:
    refunds = sims(ledger, {"refunds": {"latency_ms": 60}}).get("refunds")
    start = time.monotonic()
    refunds.dry_run("refunds.issue", "o-1", REFUND, T)
    assert time.monotonic() - start >= 0.06


def test_only_tokens_selects_exact_calls(ledger: EffectLedger) -> None:
    refunds = sims(ledger, {"refunds": {"fail": 1.0, "only_tokens": ["bad"]}}).get("refunds")
    refunds.execute("refunds.issue", "o-1", REFUND, T, "good", "i1")
    with pytest.raises(ProviderError):
        refunds.execute("refunds.issue", "o-1", REFUND, T, "bad", "i2")
    assert [e["token"] for e in ledger.effects()] == ["good"]


def test_first_n_is_counted_durably_across_instances(ledger: EffectLedger) -> None:
    """first_n counts executes against the ledger, so a restarted process does not re-fault."""
    plan = {"refunds": {"timeout_before_apply": 1.0, "first_n": 1}}
    with pytest.raises(ProviderTimeout):
        sims(ledger, plan).get("refunds").execute("refunds.issue", "o-1", REFUND, T, "k1", "i1")
    restarted = sims(EffectLedger(ledger.path), plan).get("refunds")
    restarted.execute("refunds.issue", "o-1", REFUND, T, "k1", "i1")
    assert ledger.count("k1") == 1


def _fault_outcomes(tmp: Path, seed: int) -> list[str]:
    led = EffectLedger.in_state_dir(tmp)
    refunds = sims(led, {"refunds": {"timeout_after_apply": 0.5}, "seed": seed}).get("refunds")
    outcomes = []
    for i in range(30):
        try:
            refunds.execute("refunds.issue", "o-1", {**REFUND, "amount_cents": 1}, T, f"k{i}", "i")
            outcomes.append("ok")
        except ProviderTimeout:
            outcomes.append("timeout")
    assert led.count() == 30, "timeout_after_apply always applies the effect"
    led.close()
    return outcomes


def test_probabilistic_faults_are_reproducible_from_the_seed(tmp_path: Path) -> None:
    first = _fault_outcomes(tmp_path / "a", seed=7)
    assert first == _fault_outcomes(tmp_path / "b", seed=7)
    assert {"ok", "timeout"} == set(first)


def test_fault_plan_from_env_yaml_and_validation() -> None:
    env = {"CALLGATE_FAULTS": '{"refunds": {"timeout_after_apply": 1.0, "latency_ms": 5}}'}
    plan = FaultPlan.from_env(env)
    assert plan.for_provider("refunds").timeout_after_apply == 1.0
    assert plan.for_provider("refunds").latency_ms == 5
    assert plan.for_provider("deploys") == FaultPlan.none().for_provider("deploys")
    assert FaultPlan.from_env({}) == FaultPlan.none()
    from_yaml = FaultPlan.from_yaml("seed: 3\n'*':\n  fail: 0.25\n  first_n: 2\n")
    assert from_yaml.seed == 3 and from_yaml.for_provider("users").first_n == 2
    with pytest.raises(ValidationError):
        FaultPlan.from_mapping({"refunds": {"fail": 1.5}})
    with pytest.raises(ValidationError):
        FaultPlan.from_mapping({"refunds": {"timeout_afterr_apply": 1.0}})
    with pytest.raises(ValueError):
        FaultPlan.from_env({"CALLGATE_FAULTS": "{not json"})


def _fork_child_write(led: EffectLedger) -> None:
    sims(led).get("users").execute("users.delete", "bob", {"user_id": "bob"}, T, "child", "i2")


def test_a_forked_child_opens_its_own_connection(ledger: EffectLedger) -> None:
    """SQLite connections must not cross a fork; the ledger reopens per process."""
    sims(ledger).get("users").execute("users.delete", "al", {"user_id": "al"}, T, "parent", "i1")
    proc = multiprocessing.get_context("fork").Process(target=_fork_child_write, args=(ledger,))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    assert [e["token"] for e in ledger.effects()] == ["parent", "child"]


def _crash_worker(path: str) -> None:
    led = EffectLedger(path)
    refunds = ProviderRegistry.simulated(led, {"refunds": {"crash_after_apply": True}}).get(
        "refunds"
    )
    refunds.execute("refunds.issue", "o-1", REFUND, T, "crash-tok", "inv")


def test_crash_after_apply_exits_137_with_the_effect_recorded(tmp_path: Path) -> None:
    path = str(tmp_path / "effects.sqlite")
    proc = multiprocessing.get_context("spawn").Process(target=_crash_worker, args=(path,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == CRASH_EXIT_CODE
    led = EffectLedger(path)
    assert led.count("crash-tok") == 1
    assert sims(led).get("refunds").lookup("crash-tok").found
    led.close()


# --- HTTP provider -----------------------------------------------------------------------


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    provider: Any
    sleep_s: float = 0.0
    status: int | None = None
    raw_body: bytes | None = None
    keys: list[str | None]
    hits: int = 0


class _Handler(BaseHTTPRequestHandler):
    """A provider served over HTTP: the simulated refunds provider behind the wire protocol."""

    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def _reply(self, status: int, body: Any) -> None:
        data = (
            self.server.raw_body if self.server.raw_body is not None else json.dumps(body).encode()
        )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if 300 <= status < 400:
            self.send_header("Location", "/api/elsewhere")
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, body: dict[str, Any]) -> None:
        self.server.hits += 1
        time.sleep(self.server.sleep_s)
        if self.server.status is not None:
            return self._reply(self.server.status, {"error": "injected"})
        p = self.server.provider
        try:
            if self.path == "/api/dry_run":
                snap = p.dry_run(body["tool"], body["target"], body["args"], body["tenant"])
                return self._reply(200, {"snapshot": snap.snapshot})
            if self.path == "/api/execute":
                self.server.keys.append(self.headers.get("Idempotency-Key"))
                res = p.execute(
                    body["tool"],
                    body["target"],
                    body["args"],
                    body["tenant"],
                    body["token"],
                    body["invocation_id"],
                )
                return self._reply(200, {"result": res.result})
            if self.path.startswith("/api/lookup/"):
                from urllib.parse import unquote

                found = p.lookup(unquote(self.path.removeprefix("/api/lookup/")))
                return self._reply(200, {"found": found.found, "result": found.result})
        except ProviderError as exc:
            return self._reply(422, {"error": str(exc)})
        return self._reply(404, {"error": "no route"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self._handle(json.loads(self.rfile.read(length)))

    def do_GET(self) -> None:
        self._handle({})


@pytest.fixture
def provider_http_server(ledger: EffectLedger) -> Iterator[_Server]:
    srv = _Server(("127.0.0.1", 0), _Handler)
    srv.provider, srv.keys = sims(ledger).get("refunds"), []
    thread = threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _http(srv: _Server, timeout_s: float = 5.0) -> HttpProvider:
    return HttpProvider("refunds", f"http://127.0.0.1:{srv.server_address[1]}/api/", timeout_s)


def test_http_provider_round_trip(provider_http_server: _Server, ledger: EffectLedger) -> None:
    http = _http(provider_http_server)
    snap = http.dry_run("refunds.issue", "o-1", REFUND, T).snapshot
    assert snap["refundable_after_cents"] == DEFAULT_ORDER_TOTAL_CENTS - 2500
    token = "key/with spaces?&"
    result = http.execute("refunds.issue", "o-1", REFUND, T, token, "inv-1").result
    assert result["refund_id"] == derived_id("RF", token)
    assert provider_http_server.keys == [token], "the idempotency token travels as Idempotency-Key"
    assert [e["invocation_id"] for e in ledger.effects()] == ["inv-1"]
    looked = http.lookup(token)
    assert looked.found and looked.result == result
    assert http.lookup("unknown").found is False


def test_http_provider_timeout_is_provider_timeout(
    provider_http_server: _Server, ledger: EffectLedger
) -> None:
    """C12: a socket timeout means "outcome unknown"; the effect may be applied anyway."""
    provider_http_server.sleep_s = 0.5
    http = _http(provider_http_server, timeout_s=0.1)
    with pytest.raises(ProviderTimeout):
        http.execute("refunds.issue", "o-1", REFUND, T, "slow", "inv")
    with pytest.raises(ProviderTimeout):
        http.lookup("slow")
    provider_http_server.sleep_s = 0.0
    deadline = time.monotonic() + 5
    while not ledger.count("slow") and time.monotonic() < deadline:
        time.sleep(0.02)  # the server finishes applying after the client gave up
    assert _http(provider_http_server).lookup("slow").found


@pytest.mark.parametrize(
    ("status", "expected"),
    [(400, ProviderError), (500, ProviderError), (504, ProviderTimeout), (302, ProviderError)],
)
def test_http_status_mapping_on_execute(
    provider_http_server: _Server, status: int, expected: type
) -> None:
    provider_http_server.status = status
    with pytest.raises(expected):
        _http(provider_http_server).execute("refunds.issue", "o-1", REFUND, T, "k", "i")
    assert provider_http_server.hits == 1, "no retry, no redirect followed"


def test_http_error_status_on_dry_run_and_provider_rejection(provider_http_server: _Server) -> None:
    http = _http(provider_http_server)
    with pytest.raises(ProviderError, match="422"):
        http.execute("refunds.issue", "o-1", {**REFUND, "amount_cents": -1}, T, "k", "i")
    provider_http_server.status = 504
    with pytest.raises(ProviderError):
        http.dry_run("refunds.issue", "o-1", REFUND, T)


def test_http_unreadable_success_on_execute_is_uncertain(provider_http_server: _Server) -> None:
    provider_http_server.raw_body = b"<html>ok</html>"
    http = _http(provider_http_server)
    with pytest.raises(ProviderTimeout):
        http.execute("refunds.issue", "o-1", REFUND, T, "k", "i")
    with pytest.raises(ProviderError):
        http.lookup("k")


def test_http_connection_refused_is_a_definite_error() -> None:
    port = free_port()
    http = HttpProvider("refunds", f"http://127.0.0.1:{port}", timeout_s=2)
    with pytest.raises(ProviderError):
        http.execute("refunds.issue", "o-1", REFUND, T, "k", "i")


# --- registry ----------------------------------------------------------------------------


def test_registry_get_for_tool_and_replace(ledger: EffectLedger) -> None:
    registry = sims(ledger)
    assert registry.for_tool("refunds.issue").name == "refunds"
    with pytest.raises(KeyError):
        registry.get("payments")
    with pytest.raises(KeyError):
        registry.for_tool("payments.charge")
    remote = HttpProvider("refunds", "http://127.0.0.1:1")
    replaced = registry.with_provider(remote)
    assert replaced.get("refunds") is remote and registry.get("refunds") is not remote
    assert "deploys" in replaced
    with pytest.raises(ValueError):
        ProviderRegistry([remote, remote])


# --- an upstream's JSON-RPC error: what of it is kept (ADR 0085) ---------------------------

BIG = "x" * UPSTREAM_DATA_CHARS


@pytest.mark.parametrize(
    ("message", "data", "kept_message", "kept_data"),
    [
        ("refused", {"b": [1, "ü"], "a": None}, "refused", '{"a":null,"b":[1,"ü"]}'),
        ("refused", None, "refused", ""),
        ("m" * 5_000, "small", "m" * UPSTREAM_MESSAGE_CHARS, '"small"'),
        ("refused", BIG, "refused", ""),  # its JSON is two quotes longer than the bound
        ("refused", BIG[:-2], "refused", f'"{BIG[:-2]}"'),
        ("refused", {1: "not a JSON key"}, "refused", ""),
        ("refused", float("nan"), "refused", ""),
    ],
    ids=["data", "none", "long message", "data too long", "data at the bound", "keys", "nan"],
)
def test_an_upstream_error_keeps_its_message_and_data_bounded(
    message: str, data: object, kept_message: str, kept_data: str
) -> None:
    refused = UpstreamRefused("notes write_note", -32021, message, data)
    assert (refused.code, refused.message, refused.data_json) == (-32021, kept_message, kept_data)
    assert isinstance(refused, ProviderError)  # nothing ran: a definite failure
    assert str(refused).startswith("notes write_note: upstream JSON-RPC error -32021: ")
