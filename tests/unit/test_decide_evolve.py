"""The decider's state is a fold of its events (ADR 0092), under any run (hypothesis).

*A key's events*: every event the decider saw for one partition key, in the order it saw
them: each input it handled (a request, a limit's answer, what the executor reported,
a control event), then the events it emitted for that input, in emission order; a timer's
expiries likewise. Only what was committed counts: the work of a step that was killed
before its commit is redone after the restart, and counted then.

The same holds for the limits' keyed process (``usage_process``): a scope's stored usage
is the fold of its ``evolve`` over the requests, settlements and limit changes it handled
and the answers it gave.

For random programs of the invariant tests (``test_invariants``: several actors and
tenants, keys, approvals, time, re-sends, retries, provider faults, executor crashes and
restarts, any interleaving and duplicate deliveries) on the in-memory runner, and for
random programs with kills and restarts on the embedded runner (a kill before the
round's commit, between the commit of a started execution and its provider call, and
after the provider's effect before its outcome commits), the state the runner stores for
each key equals ``evolve`` folded over that key's events, read back from the log (on the
embedded runner: decoded from the stored records).

Restoring a key's state (loading what the runner stored, folding its events) never calls a
provider: it runs with providers that fail the test when called.
"""

from __future__ import annotations

import functools
import random
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tests.harness import DAY_S, Gate
from tests.limits_support import REFUND_LIMIT, TICKET_LIMIT, limited_profile
from tests.unit.test_invariants import (
    ACTORS,
    CALLS,
    KEYS,
    Run,
    args_for,
    fault_plans,
    new_gate,
    user_call,
)
from tests.unit.test_invariants import program as invariant_programs

from callgate.adapters.avro_codec import AvroCodec
from callgate.adapters.embedded.runner import EmbeddedRunner
from callgate.adapters.embedded.store import EmbeddedStore, StoreTx
from callgate.adapters.memory import Chaos
from callgate.bootstrap import App, bootstrap
from callgate.decider.evolve import evolve
from callgate.decider.state import DeciderState, dump_state
from callgate.decider.usage_process import Usage, UsageState
from callgate.decider.usage_process import evolve as usage_evolve
from callgate.domain import events as ev
from callgate.domain.process_port import Output
from callgate.executor.invocations import Invocations, InvocationsState
from callgate.providers.base import DryRunResult, ExecutionResult, Lookup, Provider
from callgate.providers.registry import ProviderRegistry

CODEC = AvroCodec.default()
# Small enough that the programs' calls go over them: refused, and held then given back.
LIMITS: tuple[dict[str, Any], ...] = (
    {**REFUND_LIMIT, "max": 1_500, "window": "1h"},
    {**TICKET_LIMIT, "max": 2},
    {
        "name": "records-per-actor",
        "tools": ["records.update"],
        "max": 1,
        "window": "1m",
        "per": ["actor"],
    },
)


def fold(events: Sequence[ev.Event]) -> DeciderState:
    return functools.reduce(evolve, events, DeciderState())


class Journal:
    """A key's events as the decider saw them, kept as the runner commits them: what a
    step noted is ``pending`` until its commit, and dropped if the step dies first."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, list[ev.Event]]] = []
        self.committed: dict[str, list[ev.Event]] = {}

    def note(self, key: str, events: list[ev.Event]) -> None:
        self.pending.append((key, events))

    def commit(self, key: str | None = None) -> None:
        """The runner stored ``key``'s state (``None``: every key's)."""
        kept: list[tuple[str, list[ev.Event]]] = []
        for k, events in self.pending:
            if key is None or k == key:
                self.committed.setdefault(k, []).extend(events)
            else:
                kept.append((k, events))
        self.pending = kept

    def drop(self) -> None:
        self.pending = []


def watch(
    pair: Invocations, journal: Journal, kill: Callable[[str], None] = lambda _: None
) -> None:
    """Note every input the decider of ``pair`` handles and every event it emits, in order;
    ``kill("decide")`` may end the step before the decider runs."""
    decider = pair.decider
    handle, due = decider.handle, decider.due

    def handled(
        state: DeciderState, event: ev.Event, now_ms: int
    ) -> tuple[DeciderState, Sequence[Output]]:
        kill("decide")
        after, outputs = handle(state, event, now_ms)
        if type(event) in decider.reacts_to:
            journal.note(event.partition_key, [event, *_events(outputs)])
        return after, outputs

    def fired(state: DeciderState, now_ms: int) -> tuple[DeciderState, Sequence[Output]]:
        after, outputs = due(state, now_ms)
        if outputs:
            key = next(iter(state.invocations.values())).partition_key
            journal.note(key, _events(outputs))
        return after, outputs

    decider.handle = handled  # type: ignore[method-assign]
    decider.due = fired  # type: ignore[method-assign]


def _events(outputs: Sequence[Output]) -> list[ev.Event]:
    return [o for o in outputs if isinstance(o, ev.Event)]


class Tripwire:
    """A provider that fails the test if anything calls it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def dry_run(self, tool: str, target: str, args: Mapping[str, Any], tenant: str) -> DryRunResult:
        raise AssertionError(f"restoring called provider {self.name}: dry_run")

    def execute(
        self,
        tool: str,
        target: str,
        args: Mapping[str, Any],
        tenant: str,
        token: str,
        invocation_id: str,
    ) -> ExecutionResult:
        raise AssertionError(f"restoring called provider {self.name}: execute")

    def lookup(self, token: str, tool: str = "") -> Lookup:
        raise AssertionError(f"restoring called provider {self.name}: lookup")


def restoring_process(settings_of: App) -> Invocations:
    """The invocations process of a new instance of the same deployment whose every
    provider fails the test when called."""
    app = bootstrap(settings_of.settings, clock=settings_of.clock)
    app.__dict__["providers"] = ProviderRegistry(Tripwire(p.name) for p in settings_of.providers)
    return app.invocations()


def by_id(logged: Sequence[ev.Event]) -> dict[str, list[ev.Event]]:
    """Each event id's records on the log, in log order. One id can stand for two records
    that differ: the limits' answer to a request delivered twice is derived from the
    request's id, and the usage may have moved between the two answers."""
    found: dict[str, list[ev.Event]] = {}
    for record in logged:
        found.setdefault(record.event_id, []).append(record)
    return found


def read_back(
    seen: Sequence[ev.Event], occurrences: Mapping[str, list[ev.Event]]
) -> list[ev.Event]:
    """The records of ``seen`` as read back from the log: an id seen for the n-th time is
    its n-th record (its last, when the log holds fewer)."""
    used: dict[str, int] = {}
    records: list[ev.Event] = []
    for noted in seen:
        copies = occurrences[noted.event_id]
        n = used.get(noted.event_id, 0)
        used[noted.event_id] = n + 1
        records.append(copies[min(n, len(copies) - 1)])
    return records


def check_folds(
    stored: Mapping[str, bytes],
    journal: Journal,
    logged: Sequence[ev.Event],
    restore: Invocations,
) -> None:
    """Each key's stored state, restored, is the fold of its events read back from the log."""
    assert not journal.pending
    occurrences = by_id(logged)
    for key in sorted(set(stored) | set(journal.committed)):
        seen = journal.committed.get(key, [])
        missing = [e.event_id for e in seen if e.event_id not in occurrences]
        assert not missing, f"{key}: events the decider saw are not on the log: {missing}"
        state: InvocationsState = restore.load_state(stored[key]) if key in stored else None  # type: ignore[assignment]
        expected = dump_state(fold(read_back(seen, occurrences)))
        actual = dump_state(state.decider) if state is not None else dump_state(DeciderState())
        assert actual == expected, f"key {key}: the stored state is not the fold of its events"


# --- (a) the in-memory runner, under the invariant tests' programs -------------------------


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    ops=invariant_programs,
    rng=st.randoms(use_true_random=False),
    duplicate=st.sampled_from([0.0, 0.3]),
    faults=fault_plans,
    limited=st.booleans(),
)
def test_the_stored_state_of_every_key_is_the_fold_of_its_events(
    ops: list[tuple[Any, ...]],
    rng: random.Random,
    duplicate: float,
    faults: dict[str, Any],
    limited: bool,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if limited:  # usage limits too: proposals parked until each limit answers
            profile = limited_profile(Path(tmp) / "profile", *LIMITS)
            chaos = Chaos(rng, interleave=True, duplicate=duplicate)
            g = Gate(Path(tmp), faults=faults, chaos=chaos, profile=profile)
            tokens = {u: g.session(u, t, r, ttl=30 * DAY_S) for u, (t, r) in ACTORS.items()}
        else:
            g, tokens = new_gate(Path(tmp), rng, duplicate, faults)
        journal, counted = Journal(), Journal()
        pair = next(p for p in g.runner.processes if isinstance(p, Invocations))
        usage = next(p for p in g.runner.processes if isinstance(p, Usage))
        watch(pair, journal)
        watch_usage(usage, counted)
        _commit_on_store(g, {pair.name: journal, usage.name: counted}, [pair, usage])
        run = Run(g, tokens)
        for op in ops:
            run.execute(op)
        g.runner.restart()  # a crashed executor comes back; everything settles
        journal.drop()  # the work of a crashed follow-up, never committed
        stored = {
            key: pair.dump_state(state)
            for (name, key), state in g.runner._state.items()
            if name == pair.name
        }
        logged = g.runner.log.events
        check_folds(stored, journal, logged, restoring_process(g.app))
        refused = sum(isinstance(e, ev.UsageRefused) for e in g.runner.log.events)
        event(
            f"limits: {'refused' if refused else 'none refused' if counted.committed else 'none'}"
        )
        # The limits' keyed process too: each scope's usage is the fold of its events.
        for (name, key), state in g.runner._state.items():
            if name == usage.name:
                events = read_back(counted.committed.get(key, []), by_id(logged))
                folded = functools.reduce(usage_evolve, events, UsageState())
                assert usage.dump_state(state) == usage.dump_state(folded), key


def watch_usage(usage: Usage, journal: Journal) -> None:
    """Note every input the usage process handles and the answer it gives, in order."""
    handle = usage.handle

    def handled(
        state: UsageState, event: ev.Event, now_ms: int
    ) -> tuple[UsageState, Sequence[Output]]:
        after, outputs = handle(state, event, now_ms)
        if type(event) in usage.reacts_to:
            journal.note(event.partition_key, [event, *_events(outputs)])
        return after, outputs

    usage.handle = handled  # type: ignore[method-assign]


def _commit_on_store(
    g: Gate, journals: Mapping[str, Journal], processes: Sequence[Invocations | Usage]
) -> None:
    """On the in-memory runner a step's work is committed when its key's state is stored;
    a step that dies (an executor crash) is abandoned when the next one starts."""

    class Stored(dict[tuple[str, str], Any]):
        def __setitem__(self, key: tuple[str, str], value: Any) -> None:
            super().__setitem__(key, value)
            if key[0] in journals:
                journals[key[0]].commit(key[1])

    g.runner._state = Stored(g.runner._state)
    for process in processes:
        for name in ("handle", "due", "follow_up", "recover"):
            method = getattr(process, name)

            def starting(*args: Any, _method: Callable[..., Any] = method) -> Any:
                for journal in journals.values():
                    journal.drop()
                return _method(*args)

            setattr(process, name, starting)


# --- (b, c) the embedded runner, killed and restarted --------------------------------------


class Killed(BaseException):
    """kill -9, in-process: nothing after it runs, nothing uncommitted survives."""


class Kills:
    """Where the next kill lands: ``decide`` (the round's transaction never commits),
    ``call`` (after the start of an execution committed, before the provider is called),
    ``effect`` (after the provider's effect, before its outcome commits)."""

    def __init__(self) -> None:
        self.armed: str | None = None
        self.landed: list[str] = []

    def __call__(self, where: str) -> None:
        if self.armed == where:
            self.armed = None
            self.landed.append(where)
            raise Killed(where)


class Dying:
    """A provider the next ``call`` or ``effect`` kill lands in."""

    def __init__(self, inner: Provider, kills: Kills) -> None:
        self.name = inner.name
        self._inner, self._kills = inner, kills

    def dry_run(self, tool: str, target: str, args: Mapping[str, Any], tenant: str) -> DryRunResult:
        return self._inner.dry_run(tool, target, args, tenant)

    def execute(
        self,
        tool: str,
        target: str,
        args: Mapping[str, Any],
        tenant: str,
        token: str,
        invocation_id: str,
    ) -> ExecutionResult:
        self._kills("call")
        result = self._inner.execute(tool, target, args, tenant, token, invocation_id)
        self._kills("effect")
        return result

    def lookup(self, token: str, tool: str = "") -> Lookup:
        return self._inner.lookup(token, tool)


def start(g: Gate, store: EmbeddedStore, journal: Journal, kills: Kills) -> EmbeddedRunner:
    """A new runner over the same store (a restart): its processes seeded from the log."""
    runner = g.app.embedded_runner(store, CODEC)
    pair = next(p for p in runner.processes if isinstance(p, Invocations))
    watch(pair, journal, kills)
    pair.executor.providers = ProviderRegistry(Dying(p, kills) for p in pair.executor.providers)
    assert runner.acquire(timeout=5)
    return runner


@contextmanager
def _committing(journal: Journal, begin: Callable[[], Any]) -> Iterator[StoreTx]:
    with begin() as tx:
        yield tx
    journal.commit()


embedded_op = st.one_of(
    *[st.tuples(st.just("propose"), user_call, st.sampled_from(KEYS))] * 3,
    st.tuples(st.just("decide"), st.integers(0, 99), st.sampled_from(["grant", "grant", "deny"])),
    st.tuples(st.just("advance"), st.sampled_from([60_000, 1_000_000])),
    *[st.tuples(st.just("kill"), st.sampled_from(["decide", "call", "effect"]))] * 2,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(embedded_op, min_size=6, max_size=24),
    seed=st.integers(0, 2**16),
    limited=st.booleans(),
)
def test_after_kills_and_restarts_every_key_is_the_fold_of_its_logged_events(
    ops: list[tuple[Any, ...]], seed: int, limited: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        profile = limited_profile(Path(tmp) / "profile", *LIMITS) if limited else None
        faults = {"*": {"timeout_after_apply": 0.2}, "seed": seed}
        g = Gate(Path(tmp), faults=faults, profile=profile)
        tokens = {u: g.session(u, t, roles, ttl=30 * DAY_S) for u, (t, roles) in ACTORS.items()}
        store = EmbeddedStore(Path(tmp) / "embedded", CODEC)
        journal, kills = Journal(), Kills()
        begin = store.transaction
        store.transaction = lambda: _committing(journal, begin)  # type: ignore[method-assign]
        runner = start(g, store, journal, kills)

        def settle() -> EmbeddedRunner:
            nonlocal runner
            for _ in range(10):
                try:
                    runner.run_until_idle(max_seconds=60)
                    return runner
                except Killed:
                    journal.drop()  # what the dead runner had not committed is gone
                    runner.release()
                    restored = restore(g, store, journal)
                    runner = start(g, store, journal, kills)
                    assert restored == set(stored_states(store)), "every stored key restores"
            raise AssertionError("still dying after 10 restarts")

        for op in ops:
            match op:
                case ("propose", (user, call), key):
                    tool = CALLS[call][0]
                    store.append([g.proposal(tokens[user], tool, args_for(call, user), key=key)])
                case ("decide", pick, decision):
                    requested = [e for e in _logged(store) if isinstance(e, ev.ApprovalRequested)]
                    if requested:
                        request = requested[pick % len(requested)]
                        asked = g.decision(
                            tokens[_eligible(request)], request.invocation_id, decision
                        )
                        store.append([replace(asked, partition_key=request.partition_key)])
                case ("advance", ms):
                    g.runner.now_ms += ms
                    runner.fire_timers(
                        next(p for p in runner.processes if isinstance(p, Invocations))
                    )
                case ("kill", where):
                    kills.armed = where
            runner = settle()
        kills.armed = None
        runner = settle()
        runner.release()
        restored = restore(g, store, journal)
        assert restored == set(stored_states(store))
        for where in sorted(set(kills.landed)):
            event(f"a kill landed: {where}")
        event(f"keys restored: {min(len(restored), 5)}")
        event(f"executions: {min(_count(store, ev.ExecutionSucceeded), 3)}")


def restore(g: Gate, store: EmbeddedStore, journal: Journal) -> set[str]:
    """(c) Restore every stored key with providers that fail when called, and check it is
    the fold of its events as read back (decoded) from the log; the keys restored."""
    stored = stored_states(store)
    check_folds(stored, journal, _logged(store), restoring_process(g.app))
    return set(stored)


def stored_states(store: EmbeddedStore) -> dict[str, bytes]:
    conn = store._conn()
    rows = conn.execute(
        "SELECT key, blob FROM state WHERE process = ?", (Invocations.name,)
    ).fetchall()
    return {key: bytes(state) for key, state in rows}


def _logged(store: EmbeddedStore) -> list[ev.Event]:
    return [
        store.codec.decode(row.payload)
        for topic in ("requests", "events")
        for row in store.read_log(topic, limit=1_000_000)
    ]


def _count(store: EmbeddedStore, cls: type[ev.Event]) -> int:
    return sum(isinstance(e, cls) for e in _logged(store))


def _eligible(request: ev.ApprovalRequested) -> str:
    from tests.unit.test_invariants import eligible

    return eligible(request)
