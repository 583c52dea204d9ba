"""The bundled simulated providers and their fault injection (docs/contract.md "Providers", C12).

Five simulations (tickets, records, refunds, deploys, users) keep their world state and
every applied effect in the durable ``EffectLedger``. Two deliberate properties:

- ``execute`` does NOT deduplicate by token: a second execute with the same token applies
  a second effect. Tests therefore prove that callgate itself never executes twice; the
  sims do not hide it.
- ``dry_run`` is read-only and a pure function of (world state, arguments), so the
  snapshot a human confirms (C5) is reproducible.

Faults (``FaultPlan``) make the executor's hard cases reachable on demand: latency, a
definite failure, a timeout before the effect (nothing applied), a timeout after it (the
effect exists; ``lookup`` finds it, C12) and, only when explicitly enabled, a process
crash right after the effect was recorded. Randomness comes from an injected
``random.Random``; ``only_tokens`` / ``first_n`` select exact calls.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field

from callgate.domain.catalog import StrictYamlLoader
from callgate.domain.limits import parse_document
from callgate.providers.base import (
    DryRunResult,
    ExecutionResult,
    Lookup,
    ProviderError,
    ProviderTimeout,
    ResourceDescription,
)
from callgate.providers.ledger import EffectLedger, WorldTxn

FAULTS_ENV = "CALLGATE_FAULTS"
CRASH_EXIT_CODE = 137  # what a SIGKILLed process reports; the executor treats it as a crash
DEFAULT_ORDER_TOTAL_CENTS = 1_000_000  # orders nobody seeded: 10,000.00 in any currency

Getter = Callable[[tuple[str, ...]], Any]

# --- fault injection --------------------------------------------------------------------


class FaultSpec(BaseModel):
    """Faults for one provider. Probabilities are in [0, 1]; 1.0 means always."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    latency_ms: int = Field(default=0, ge=0)
    fail: float = Field(default=0.0, ge=0.0, le=1.0)
    timeout_before_apply: float = Field(default=0.0, ge=0.0, le=1.0)
    timeout_after_apply: float = Field(default=0.0, ge=0.0, le=1.0)
    fail_dry_run: float = Field(default=0.0, ge=0.0, le=1.0)
    crash_after_apply: bool = False
    # Selection: execute faults hit only these tokens and/or only the first n matching
    # execute calls against this ledger (counted durably, so across processes too).
    only_tokens: frozenset[str] | None = None
    first_n: int | None = Field(default=None, ge=0)


class FaultPlan(BaseModel):
    """Faults per provider name; ``"*"`` applies to providers not named explicitly."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    providers: dict[str, FaultSpec] = Field(default_factory=dict)
    seed: int = 0

    @classmethod
    def none(cls) -> FaultPlan:
        return cls()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> FaultPlan:
        """``{"refunds": {"timeout_after_apply": 1.0}, "seed": 7}`` (``seed`` is optional)."""
        specs = {k: v for k, v in data.items() if k != "seed"}
        return cls.model_validate({"providers": specs, "seed": data.get("seed", 0)})

    @classmethod
    def from_yaml(cls, source: str | Path) -> FaultPlan:
        text = source.read_text() if isinstance(source, Path) else source
        data = yaml.load(text, Loader=StrictYamlLoader) or {}
        if not isinstance(data, dict):
            raise ValueError("a fault plan must be a mapping of provider name to faults")
        return cls.from_mapping(data)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> FaultPlan:
        """Read ``CALLGATE_FAULTS`` (JSON); a malformed plan is an error, never ignored."""
        raw = environ.get(FAULTS_ENV, "").strip()
        if not raw:
            return cls.none()
        data = parse_document(raw)  # the one strict reader: no duplicate keys
        if not isinstance(data, dict):
            raise ValueError(f"{FAULTS_ENV} must be a JSON object")
        return cls.from_mapping(data)

    def for_provider(self, name: str) -> FaultSpec:
        return self.providers.get(name) or self.providers.get("*") or FaultSpec()


class FaultInjector:
    """Applies one ``FaultSpec`` with an injected random source."""

    def __init__(
        self, provider: str, spec: FaultSpec, rng: random.Random, ledger: EffectLedger
    ) -> None:
        self._provider, self.spec, self._rng, self._ledger = provider, spec, rng, ledger

    def delay(self) -> None:
        if self.spec.latency_ms:
            time.sleep(self.spec.latency_ms / 1000)

    def roll(self, probability: float) -> bool:
        # No draw for a disabled fault, so enabling one fault does not shift the others.
        return probability > 0.0 and self._rng.random() < probability

    def selected(self, token: str) -> bool:
        """Is this execute call one that execute faults may hit?"""
        if self.spec.only_tokens is not None and token not in self.spec.only_tokens:
            return False
        if self.spec.first_n is None:
            return True
        return self._ledger.bump(("_faults", self._provider, "execute")) <= self.spec.first_n


# --- argument helpers (callgate validated the schema; fail closed anyway) ---------------


def _str(args: Mapping[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value:
        raise ProviderError(f"argument {name!r} must be a non-empty string")
    return value


def _int(args: Mapping[str, Any], name: str) -> int:
    value = args.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProviderError(f"argument {name!r} must be an integer")
    return value


def _obj(args: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = args.get(name)
    if not isinstance(value, Mapping):
        raise ProviderError(f"argument {name!r} must be an object")
    return dict(value)


def derived_id(prefix: str, token: str) -> str:
    """A deterministic id from the idempotency token (same token, same id)."""
    return f"{prefix}-{hashlib.sha256(token.encode()).hexdigest()[:12]}"


# --- the simulations --------------------------------------------------------------------


class SimulatedProvider(ABC):
    """Shared shell: tool dispatch, faults, and recording effects in the ledger.

    Subclasses implement ``_preview`` (read-only, used by ``dry_run`` and by reads) and
    ``_apply`` (inside the ledger's write transaction; raising leaves no effect).
    """

    name: str
    tools: ClassVar[frozenset[str]]
    reads: ClassVar[frozenset[str]] = frozenset()  # tools that apply no effect (C2)

    def __init__(
        self,
        ledger: EffectLedger,
        faults: FaultSpec | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.ledger = ledger
        self.faults = FaultInjector(
            self.name, faults or FaultSpec(), rng or random.Random(self.name), ledger
        )

    def _check(self, tool: str) -> None:
        if tool not in self.tools:
            raise ProviderError(f"provider {self.name!r} has no tool {tool!r}")

    def dry_run(self, tool: str, target: str, args: Mapping[str, Any], tenant: str) -> DryRunResult:
        self._check(tool)
        self.faults.delay()
        if self.faults.roll(self.faults.spec.fail_dry_run):
            raise ProviderError(f"injected dry-run failure ({self.name})")
        return DryRunResult(self._preview(tool, args, tenant, self.ledger.world_get))

    def execute(
        self,
        tool: str,
        target: str,
        args: Mapping[str, Any],
        tenant: str,
        token: str,
        invocation_id: str,
    ) -> ExecutionResult:
        self._check(tool)
        faults, spec = self.faults, self.faults.spec
        faults.delay()
        hit = faults.selected(token)
        if hit and faults.roll(spec.fail):
            raise ProviderError(f"injected failure ({self.name}), nothing applied")
        if hit and faults.roll(spec.timeout_before_apply):
            raise ProviderTimeout(f"injected timeout before apply ({self.name})")
        if tool in self.reads:
            result = self._preview(tool, args, tenant, self.ledger.world_get)
        else:
            row = self.ledger.apply(
                provider=self.name,
                tool=tool,
                target=target,
                tenant=tenant,
                token=token,
                invocation_id=invocation_id,
                args=args,
                result=lambda txn: self._apply(tool, args, tenant, token, txn),
            )
            result = row["result"]
            if hit and spec.crash_after_apply:
                os._exit(CRASH_EXIT_CODE)  # the effect is durable; the caller never hears
        if hit and faults.roll(spec.timeout_after_apply):
            raise ProviderTimeout(f"injected timeout after apply ({self.name})")
        return ExecutionResult(result)

    def lookup(self, token: str, tool: str = "") -> Lookup:
        self.faults.delay()
        row = self.ledger.find(token, provider=self.name)
        return Lookup(found=False, result=None) if row is None else Lookup(True, row["result"])

    def describe(self, tool: str, target: str) -> ResourceDescription:
        """The owner of a resource this simulation created (C7), and its attributes."""
        self.faults.delay()
        owner = self.ledger.world_get(("owners", self.name, target))
        if not isinstance(owner, str):
            return ResourceDescription(found=False, tenant=None, attributes={})
        return ResourceDescription(True, owner, self._attributes(owner, target))

    def _attributes(self, tenant: str, target: str) -> dict[str, Any]:
        """Attributes of an owned resource the policy may use; none by default."""
        return {}

    @abstractmethod
    def _preview(
        self, tool: str, args: Mapping[str, Any], tenant: str, get: Getter
    ) -> dict[str, Any]:
        """Read-only: what ``tool`` would do (dry-runs and reads)."""

    @abstractmethod
    def _apply(
        self, tool: str, args: Mapping[str, Any], tenant: str, token: str, txn: WorldTxn
    ) -> dict[str, Any]:
        """Apply ``tool`` inside the ledger transaction ``txn``; the recorded result."""


class TicketsProvider(SimulatedProvider):
    name = "tickets"
    tools = frozenset({"tickets.read", "tickets.create"})
    reads = frozenset({"tickets.read"})

    def _preview(
        self, tool: str, args: Mapping[str, Any], tenant: str, get: Getter
    ) -> dict[str, Any]:
        if tool == "tickets.read":
            ticket_id = _str(args, "ticket_id")
            stored = get(("tickets", tenant, ticket_id))
            if stored is not None:
                return dict(stored)
            # Tickets nobody created read as a fixed sample, so reads work on a fresh state.
            return {
                "ticket_id": ticket_id,
                "title": f"Sample ticket {ticket_id}",
                "status": "open",
                "tenant": tenant,
                "synthetic": True,
            }
        return {"would_create": self._ticket(args, tenant, ticket_id=None)}

    def _apply(
        self, tool: str, args: Mapping[str, Any], tenant: str, token: str, txn: WorldTxn
    ) -> dict[str, Any]:
        ticket = self._ticket(args, tenant, ticket_id=derived_id("TKT", token))
        txn.put(("tickets", tenant, ticket["ticket_id"]), ticket)
        # The creating tenant owns the ticket from now on (C7: ``describe``).
        txn.put(("owners", self.name, ticket["ticket_id"]), tenant)
        return ticket

    def _attributes(self, tenant: str, target: str) -> dict[str, Any]:
        ticket = self.ledger.world_get(("tickets", tenant, target)) or {}
        return {k: ticket[k] for k in ("status", "priority", "requester_id") if k in ticket}

    @staticmethod
    def _ticket(args: Mapping[str, Any], tenant: str, ticket_id: str | None) -> dict[str, Any]:
        _str(args, "title")
        _str(args, "requester_id")
        return {**dict(args), "ticket_id": ticket_id, "status": "open", "tenant": tenant}


class RecordsProvider(SimulatedProvider):
    name = "records"
    tools = frozenset({"records.update"})

    def _preview(
        self, tool: str, args: Mapping[str, Any], tenant: str, get: Getter
    ) -> dict[str, Any]:
        record_id, fields = _str(args, "record_id"), _obj(args, "fields")
        current: dict[str, Any] = get(("records", tenant, record_id)) or {}
        return {
            "record_id": record_id,
            "before": {k: current.get(k) for k in sorted(fields)},
            "after": {k: fields[k] for k in sorted(fields)},
            "changed": sorted(k for k in fields if current.get(k) != fields[k]),
        }

    def _apply(
        self, tool: str, args: Mapping[str, Any], tenant: str, token: str, txn: WorldTxn
    ) -> dict[str, Any]:
        preview = self._preview(tool, args, tenant, txn.get)
        key = ("records", tenant, preview["record_id"])
        merged = {**(txn.get(key) or {}), **_obj(args, "fields")}
        txn.put(key, merged)
        return {"record_id": preview["record_id"], "fields": merged, "changed": preview["changed"]}

    @staticmethod
    def seed_record(
        ledger: EffectLedger, tenant: str, record_id: str, fields: Mapping[str, Any]
    ) -> None:
        """Give a record known current fields (demos and tests; not an effect)."""
        ledger.world_put(("records", tenant, record_id), dict(fields))


class RefundsProvider(SimulatedProvider):
    name = "refunds"
    tools = frozenset({"refunds.issue"})

    def _preview(
        self, tool: str, args: Mapping[str, Any], tenant: str, get: Getter
    ) -> dict[str, Any]:
        order_id = _str(args, "order_id")
        amount = _int(args, "amount_cents")
        currency = _str(args, "currency")
        order = self.order(get, tenant, order_id)
        if amount <= 0:
            raise ProviderError("amount_cents must be positive")
        if order["currency"] is not None and order["currency"] != currency:
            raise ProviderError(f"order {order_id} is in {order['currency']}, not {currency}")
        refundable = order["total_cents"] - order["refunded_cents"]
        if amount > refundable:
            raise ProviderError(f"refund of {amount} exceeds refundable balance {refundable}")
        return {
            "order_id": order_id,
            "amount_cents": amount,
            "currency": currency,
            "order_total_cents": order["total_cents"],
            "refunded_cents": order["refunded_cents"],
            "refundable_cents": refundable,
            "refundable_after_cents": refundable - amount,
        }

    def _apply(
        self, tool: str, args: Mapping[str, Any], tenant: str, token: str, txn: WorldTxn
    ) -> dict[str, Any]:
        preview = self._preview(tool, args, tenant, txn.get)
        order_id = preview["order_id"]
        order = self.order(txn.get, tenant, order_id)
        order["refunded_cents"] += preview["amount_cents"]
        order["currency"] = preview["currency"]  # the first refund fixes an unseeded order's
        txn.put(("orders", tenant, order_id), order)
        return {
            "refund_id": derived_id("RF", token),
            "order_id": order_id,
            "amount_cents": preview["amount_cents"],
            "currency": preview["currency"],
            "issued_by": args.get("issued_by"),
            "refunded_cents": order["refunded_cents"],
            "refundable_cents": preview["refundable_after_cents"],
        }

    @staticmethod
    def order(get: Getter, tenant: str, order_id: str) -> dict[str, Any]:
        stored = get(("orders", tenant, order_id))
        default = {"total_cents": DEFAULT_ORDER_TOTAL_CENTS, "refunded_cents": 0, "currency": None}
        return {**default, **(stored or {})}

    @staticmethod
    def seed_order(
        ledger: EffectLedger, tenant: str, order_id: str, total_cents: int, currency: str
    ) -> None:
        """Give an order a known total and currency (demos and tests; not an effect)."""
        ledger.world_put(
            ("orders", tenant, order_id),
            {"total_cents": total_cents, "refunded_cents": 0, "currency": currency},
        )


class DeploysProvider(SimulatedProvider):
    name = "deploys"
    tools = frozenset({"deploys.trigger"})

    def _preview(
        self, tool: str, args: Mapping[str, Any], tenant: str, get: Getter
    ) -> dict[str, Any]:
        service = _str(args, "service")
        version = _str(args, "version")
        env = _str(args, "environment")
        current = (get(("deploys", tenant, service, env)) or {}).get("version")
        return {
            "service": service,
            "environment": env,
            "current_version": current,
            "new_version": version,
            "changed": current != version,
        }

    def _apply(
        self, tool: str, args: Mapping[str, Any], tenant: str, token: str, txn: WorldTxn
    ) -> dict[str, Any]:
        preview = self._preview(tool, args, tenant, txn.get)
        service, env = preview["service"], preview["environment"]
        txn.put(("deploys", tenant, service, env), {"version": preview["new_version"]})
        return {
            "deployment_id": derived_id("DEP", token),
            "service": service,
            "environment": env,
            "previous_version": preview["current_version"],
            "version": preview["new_version"],
        }


class UsersProvider(SimulatedProvider):
    name = "users"
    tools = frozenset({"users.delete"})

    def _preview(
        self, tool: str, args: Mapping[str, Any], tenant: str, get: Getter
    ) -> dict[str, Any]:
        user_id = _str(args, "user_id")
        state = (get(("users", tenant, user_id)) or {}).get("state", "active")
        return {"user_id": user_id, "state": state, "after": "deleted"}

    def _apply(
        self, tool: str, args: Mapping[str, Any], tenant: str, token: str, txn: WorldTxn
    ) -> dict[str, Any]:
        preview = self._preview(tool, args, tenant, txn.get)
        txn.put(("users", tenant, preview["user_id"]), {"state": "deleted"})
        # Deleting a deleted user is still recorded: a duplicate execute must be visible.
        return {"user_id": preview["user_id"], "deleted": True, "previous_state": preview["state"]}


SIMULATED: tuple[type[SimulatedProvider], ...] = (
    TicketsProvider,
    RecordsProvider,
    RefundsProvider,
    DeploysProvider,
    UsersProvider,
)
