"""Resource ownership from the system of record (C7, ADR 0014).

A target no static ``resources`` glob claims is described by its provider, through
events: the decider asks (``ResourceDescriptionRequested``), the executor answers
(``ResourceDescribed``), and the decision records the facts it evaluated
(``PolicyDecided.resource_json``). A ticket that ``tickets.create`` made belongs to the
creating tenant; another tenant gets ``tool_forbidden``; a resource nobody owns is denied
with a message that says so. Cedar sees the provider's attributes as entity attributes.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.harness import Gate, write_profile

from callgate.domain import events as ev
from callgate.executor.descriptions import DescriptionCache
from callgate.executor.invocations import Invocations
from callgate.providers.base import ResourceDescription

TICKET = {"title": "Printer on fire", "requester_id": "alice"}


def created_ticket(g: Gate, token: str, **extra: str) -> str:
    inv = g.propose(token, "tickets.create", {**TICKET, **extra}, key="create")
    assert g.outcome(inv) == "executed"
    ticket_id = str(g.status(inv)["result"]["ticket_id"])
    assert ticket_id.startswith("TKT-")
    return ticket_id


def test_a_created_ticket_belongs_to_the_creating_tenant(tmp_path: Path) -> None:
    g = Gate(tmp_path)
    alice = g.session("alice", "acme", ("support",))
    gina = g.session("gina", "globex", ("support",))
    ticket_id = created_ticket(g, alice)

    mine = g.propose(alice, "tickets.read", {"ticket_id": ticket_id})
    assert g.outcome(mine) == "executed"
    assert g.status(mine)["result"]["title"] == "Printer on fire"
    [asked] = g.events_of(mine, ev.ResourceDescriptionRequested)
    assert (asked.tool, asked.target, asked.provider) == ("tickets.read", ticket_id, "tickets")
    [decided] = g.events_of(mine, ev.PolicyDecided)
    assert decided.resource_json is not None
    assert json.loads(decided.resource_json) == {
        "source": "provider:tickets",
        "tenant": "acme",
        "attributes": {"priority": "normal", "requester_id": "alice", "status": "open"},
    }

    [record] = g.audit(mine)[-1:]  # C9: the audit names the owner the ACL evaluated
    assert record["authorized_by"]["resource"]["tenant"] == "acme"
    theirs = g.propose(gina, "tickets.read", {"ticket_id": ticket_id})
    assert g.outcome(theirs) == "tool_forbidden"
    assert g.events_of(theirs, ev.PolicyDecided)[0].determining_policies == ("tenant-isolation",)
    assert not g.events_of(theirs, ev.ExecutionRequested)  # C12: never reaches a provider


def test_a_resource_nobody_owns_fails_closed_saying_so(tmp_path: Path) -> None:
    g = Gate(tmp_path)
    alice = g.session("alice", "acme", ("support",))
    inv = g.propose(alice, "tickets.read", {"ticket_id": "TKT-nobody"})
    assert g.outcome(inv) == "tool_forbidden"
    message = g.status(inv)["error"]["message"]
    assert "'TKT-nobody' is owned by no tenant" in message
    assert "provider 'tickets' does not know an owner" in message
    [described] = g.events_of(inv, ev.ResourceDescribed)
    assert (described.found, described.owner) == (False, None)


def test_static_globs_override_without_asking_the_provider(tmp_path: Path) -> None:
    g = Gate(tmp_path)
    alice = g.session("alice", "acme", ("support",))
    inv = g.propose(alice, "tickets.read", {"ticket_id": "T-1"})  # acme: ["T-*", ...]
    assert g.outcome(inv) == "executed"
    assert not g.events_of(inv, ev.ResourceDescriptionRequested)
    [decided] = g.events_of(inv, ev.PolicyDecided)
    assert json.loads(decided.resource_json or "") == {
        "source": "profile",
        "tenant": "acme",
        "attributes": {},
    }
    create = g.propose(alice, "tickets.create", TICKET)
    assert g.events_of(create, ev.PolicyDecided)[0].resource_json is None  # a new resource


def test_cedar_sees_the_providers_attributes(tmp_path: Path) -> None:
    """An adopter's policy on a provider attribute (the guide's example)."""
    policy = """
@id("high-priority-tickets-for-admins")
forbid (principal, action == Action::"tickets.read", resource)
when { resource has priority && resource.priority == "high" }
unless { principal.roles.contains("admin") };
"""
    g = Gate(tmp_path / "state", profile=write_profile(tmp_path / "profile", policy_suffix=policy))
    alice = g.session("alice", "acme", ("support",))
    root = g.session("root", "acme", ("admin",))
    urgent = created_ticket(g, alice, priority="high")
    refused = g.propose(alice, "tickets.read", {"ticket_id": urgent})
    assert g.outcome(refused) == "tool_forbidden"
    assert g.events_of(refused, ev.PolicyDecided)[0].determining_policies == (
        "high-priority-tickets-for-admins",
    )
    assert g.outcome(g.propose(root, "tickets.read", {"ticket_id": urgent})) == "executed"


def test_descriptions_are_cached_for_a_bounded_time_and_dropped_after_an_effect() -> None:
    cache = DescriptionCache(ttl_ms=1_000, size=2)
    found = ResourceDescription(True, "acme", {})
    cache.put("tickets", "TKT-1", found, now_ms=0)
    assert cache.get("tickets", "TKT-1", now_ms=999) is found
    assert cache.get("tickets", "TKT-1", now_ms=1_000) is None  # expired
    cache.put("tickets", "a", found, 0)
    cache.put("tickets", "b", found, 0)
    cache.put("tickets", "c", found, 0)
    assert cache.get("tickets", "a", 0) is None  # bounded: the oldest went first
    cache.forget("tickets")
    assert cache.get("tickets", "c", 0) is None


def test_the_executor_reuses_a_description_within_its_lifetime(tmp_path: Path) -> None:
    g = Gate(tmp_path)
    g.record_provider_calls()
    alice = g.session("alice", "acme", ("support",))
    ticket_id = created_ticket(g, alice)
    (executor,) = (p.executor for p in g.runner.processes if isinstance(p, Invocations))
    described = executor.descriptions
    for _ in range(3):
        assert g.outcome(g.propose(alice, "tickets.read", {"ticket_id": ticket_id})) == "executed"
    assert g.calls.count(("describe", ticket_id)) == 1  # asked once, then cached
    g.runner.advance(31_000)
    assert g.outcome(g.propose(alice, "tickets.read", {"ticket_id": ticket_id})) == "executed"
    assert g.calls.count(("describe", ticket_id)) == 2  # the cached answer expired
    assert described.get("tickets", ticket_id, g.runner.now_ms) is not None
