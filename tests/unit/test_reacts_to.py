"""``reacts_to``: a process's declared event types are exactly those ``handle`` acts on.

Runners skip loading state and calling ``handle`` for any other event
(``callgate.domain.process_port.reacts_to``). That is only sound if ``handle`` leaves the state (as
bytes) unchanged and emits nothing for those events, whatever state it is given; this folds
a log that holds every event type through each declaring process, key by key, and checks
every skipped event against the state the process had reached at that point.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from tests.harness import Gate, write_profile
from tests.unit.test_freeze import freeze_event

from callgate.domain import events as ev
from callgate.domain.process_port import Process, reacts_to
from callgate.executor.invocations import Invocations

TICKET: dict[str, Any] = {"title": "Printer on fire", "requester_id": "alice"}
REFUND: dict[str, Any] = {"order_id": "ORD-1", "amount_cents": 500, "currency": "USD"}
BIG_REFUND: dict[str, Any] = {"order_id": "ORD-2", "amount_cents": 50_000, "currency": "USD"}


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Gate, list[ev.Event]]:
    """A log with every event type a process reads: grants, denials, expiries, rejected
    decisions, rejections, replays, dry-runs, an uncertain execution and its
    reconciliation, a resource description."""
    state = tmp_path_factory.mktemp("reacts") / "state"
    # production deploys need two approvers (ADR 0030): a grant towards the quorum
    profile = write_profile(
        state.parent / "profile",
        lambda tools: tools["deploys.trigger"].update(
            approvals_required=2,
            approvals_required_when={"arg": "environment", "values": ["production"]},
        ),
    )
    # ADR 0079: two reads an hour, so the third is refused by its limit
    reads = {"name": "reads", "tools": ["tickets.read"], "max": 2, "window": "1h"}
    profile.write_text(profile.read_text() + yaml.safe_dump({"limits": [reads]}))
    g = Gate(
        state,
        profile=profile,
        faults={
            "tickets": {"timeout_before_apply": 1.0, "first_n": 1},
            "records": {"fail_dry_run": 1.0},
            "deploys": {"fail": 1.0},
        },
    )
    alice = g.session("alice", roles=("support",))
    bob = g.session("bob", roles=("finance-approver",))
    first = g.propose(alice, "tickets.create", TICKET, key="create")  # uncertain
    assert g.outcome(first) == "outcome_uncertain"
    g.propose(alice, "tickets.create", TICKET, key="create")  # reconciles, executes
    g.propose(alice, "tickets.create", TICKET, key="create")  # replayed
    g.propose(alice, "tickets.read", {"ticket_id": "T-1"})
    g.propose(alice, "tickets.read", {"ticket_id": "TKT-unknown"})  # the provider is asked
    g.propose(alice, "tickets.read", {"ticket_id": "T-1"})
    g.propose(alice, "tickets.read", {"ticket_id": "T-1"})  # limit_exceeded (ADR 0079)
    g.propose(alice, "users.delete", {"user_id": "U-1"})  # not a caller: policy denies
    g.propose(alice, "no.such.tool", {})  # rejected before policy
    owner = g.propose(alice, "refunds.issue", REFUND)
    g.propose(alice, "refunds.issue", REFUND, approval_id=g.approve(alice, owner))
    big = g.propose(alice, "refunds.issue", BIG_REFUND, key="big")
    g.decide(alice, big)  # the actor may not approve: decision rejected
    g.propose(alice, "refunds.issue", BIG_REFUND, key="big", approval_id=g.approve(bob, big))
    denied = g.propose(alice, "refunds.issue", {**BIG_REFUND, "order_id": "ORD-3"})
    g.decide(bob, denied, "deny")
    g.propose(alice, "refunds.issue", {**BIG_REFUND, "order_id": "ORD-4"})
    g.propose(alice, "records.update", {"record_id": "REC-1", "fields": {"a": 1}})  # dry-run fails
    carol = g.session("carol", roles=("release",))
    deploy: dict[str, Any] = {"service": "billing", "version": "1.2.3", "environment": "staging"}
    asked = g.propose(carol, "deploys.trigger", deploy)
    manager = g.session("dave", roles=("release-manager",))
    g.propose(carol, "deploys.trigger", deploy, approval_id=g.approve(manager, asked))  # fails
    production = g.propose(carol, "deploys.trigger", {**deploy, "environment": "production"})
    g.decide(manager, production)  # one grant of two
    _policy_versions(g, alice)
    g.runner.publish(freeze_event("tool", "users.delete"))  # ADR 0054
    g.runner.publish(freeze_event("tool", "users.delete", lift=True, n=2))
    digest, other = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    g.runner.publish(  # ADR 0066
        ev.ToolPinned(event_id="pin-1", invocation_id="pins", partition_key="pins",
                      tool="users.delete", digest=digest, reason="r", author="olga",
                      tenant="ops"),
        ev.ToolDefinitionChanged(event_id="pin-2", invocation_id="pins", partition_key="pins",
                                 tool="users.delete", pinned_digest=digest, seen_digest=other),
    )  # fmt: skip
    reads_key = g.app.profile.limits[0].scope_key("acme", "alice", "", "tickets.read")
    g.runner.publish(  # ADR 0079: an operator raises the reads limit of acme
        ev.UsageLimitChanged(event_id="raise-1", invocation_id="limits", partition_key=reads_key,
                             limit="reads", scope_json='{"tenant":"acme"}', action="raise",
                             raise_by=1, reason="r", author="olga", tenant="ops"),
    )  # fmt: skip
    g.runner.run()
    g.runner.advance(24 * 3_600_000)  # the last ones' approvals expire
    return g, g.events()


def _policy_versions(g: Gate, caller: str) -> None:
    """A version published, run in shadow (one call it decides otherwise), activated."""
    from callgate.domain.catalog import default_profile_path
    from callgate.domain.policy_versions import content_of

    path = default_profile_path()
    text = path.read_text(encoding="utf-8")
    cedar = (path.parent / "default.cedar").read_text(encoding="utf-8")
    cedar += '\nforbid (principal, action == Action::"tickets.read", resource);\n'
    version = content_of(text, cedar).digest
    common: dict[str, Any] = {
        "invocation_id": "policy", "partition_key": ev.POLICY_KEY, "author": "olga",
        "tenant": "ops", "reason": "test", "version": version,
    }  # fmt: skip
    g.runner.publish(
        ev.PolicyPublished(event_id="p1", profile_yaml=text, policy_text=cedar, **common),
        ev.PolicyShadowSet(event_id="p2", **common),
    )
    g.runner.run()
    g.propose(caller, "tickets.read", {"ticket_id": "T-2"})  # the shadow forbids it
    g.runner.publish(ev.PolicyActivated(event_id="p3", **common))
    g.runner.run()


def declaring(g: Gate) -> list[Process[Any]]:
    return [p for p in g.app.processes() if reacts_to(p) is not None]


def test_the_log_holds_every_event_type_the_processes_skip(
    log: tuple[Gate, list[ev.Event]],
) -> None:
    g, events = log
    seen = {type(e) for e in events}
    for process in declaring(g):
        skipped = {t for t in _event_types() if t not in (reacts_to(process) or ())}
        missing = skipped - seen - {ev.EventDeadLettered}  # never on ``events``
        assert not missing, f"{process.name}: no example of {sorted(t.__name__ for t in missing)}"


def test_handle_does_nothing_for_event_types_outside_reacts_to(
    log: tuple[Gate, list[ev.Event]],
) -> None:
    g, events = log
    processes = declaring(g)
    assert {p.name for p in processes} >= {"invocations"}
    for process in processes:
        declared = reacts_to(process) or frozenset()
        states: dict[str, Any] = {}
        skipped = 0
        for event in events:
            if event.TOPIC not in process.inputs:
                continue
            state = states.get(event.partition_key, process.initial_state())
            before = process.dump_state(state)
            state, outputs = process.handle(state, event, g.runner.now_ms)
            if type(event) not in declared:
                skipped += 1
                assert outputs == [] or outputs == (), (process.name, event.event_type)
                assert process.dump_state(state) == before, (process.name, event.event_type)
            states[event.partition_key] = state
        assert skipped > 0


def _event_types() -> set[type[ev.Event]]:
    return {
        cls
        for cls in vars(ev).values()
        if isinstance(cls, type) and issubclass(cls, ev.Event) and cls is not ev.Event
    }


def test_every_event_type_of_a_topic_has_a_reader_that_decodes_it(
    log: tuple[Gate, list[ev.Event]],
) -> None:
    """The Kafka runner consumes a record whose header names a type its process does not
    react to without decoding the body. A corrupt body is then dead-lettered only by the
    readers that do react to it, so every type that belongs on a topic needs one."""
    g, _ = log
    processes = g.app.processes()
    for cls in _event_types() - {ev.EventDeadLettered}:  # nobody reads the dead-letter topic
        readers = [p for p in processes if cls.TOPIC in p.inputs]
        assert readers, f"no process reads {cls.TOPIC}"
        decoding = [p.name for p in readers if reacts_to(p) is None or cls in (reacts_to(p) or ())]
        # What the invocations process hands from its decider to its executor and back is
        # folded as it is written (ADR 0077): its copy on the log is for everyone else.
        folded = [p.name for p in processes if isinstance(p, Invocations) and cls in p.carries]
        assert decoding or folded, f"{cls.__name__} on {cls.TOPIC}: no reader reacts to it"
