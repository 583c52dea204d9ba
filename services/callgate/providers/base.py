"""The one interface every tool provider implements (docs/contract.md "Providers", C12).

The executor talks to providers only through this protocol: ``dry_run`` (read-only, what
a human confirms, C5), ``execute`` (with callgate's idempotency token passed through) and
``lookup`` (reconcile an uncertain outcome before any retry, C12). A provider that is the
system of record of its resources may also ``describe`` one (``Describes``): its owning
tenant and attributes, which the ACL evaluates (C7, docs/adr/0014).

The two exceptions split failures by what is known about the effect (an exception of any
other kind counts as ``ProviderTimeout`` for ``execute``, as ``ProviderError`` otherwise):

- ``ProviderError``: definite failure, nothing was applied; the executor may report
  ``execution_failed``. ``UpstreamRefused`` is one the upstream answered as a JSON-RPC
  error, whose code, message and data the outcome keeps so that the agent gets them.
- ``ProviderTimeout``: the outcome is unknown, the effect may or may not exist; the
  executor must report ``outcome_uncertain`` and reconcile with ``lookup`` (C12).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

# The failure kinds a runner retries, defined with the vocabulary (``domain.codes``).
from callgate.domain.canonical import canonical_json
from callgate.domain.codes import INFRASTRUCTURE_ERRORS as INFRASTRUCTURE_ERRORS


class ProviderTimeout(Exception):
    """Outcome unknown: the effect may or may not have been applied (C12)."""


class ProviderError(Exception):
    """Definite failure: no effect was applied."""


# What of an upstream's JSON-RPC error is kept: its message cut to this many characters,
# its data only while its canonical JSON fits in this many (a cut JSON is no JSON).
UPSTREAM_MESSAGE_CHARS = 1_000
UPSTREAM_DATA_CHARS = 4_096


class UpstreamRefused(ProviderError):
    """The upstream answered with a JSON-RPC error: it refused, nothing ran (ADR 0075).

    ``code``, ``message`` and ``data_json`` (canonical JSON, empty for none) are the
    upstream's own, bounded, so that the agent can be answered with the same error.
    """

    def __init__(self, where: str, code: int, message: str, data: object = None) -> None:
        super().__init__(f"{where}: upstream JSON-RPC error {code}: {message}")
        self.code = code
        self.message = message[:UPSTREAM_MESSAGE_CHARS]
        self.data_json = _bounded_json(data)


def _bounded_json(data: object) -> str:
    """``data`` as canonical JSON when it is JSON and small enough, else empty."""
    if data is None:
        return ""
    try:
        text = canonical_json(data)
    except (TypeError, ValueError):
        return ""
    return text if len(text) <= UPSTREAM_DATA_CHARS else ""


@dataclass(frozen=True)
class DryRunResult:
    snapshot: dict[str, Any]


@dataclass(frozen=True)
class ExecutionResult:
    result: dict[str, Any]


@dataclass(frozen=True)
class Lookup:
    """What a provider knows about an idempotency token (C12 reconciliation)."""

    found: bool
    result: dict[str, Any] | None


@runtime_checkable
class Provider(Protocol):
    name: str

    def dry_run(self, tool: str, target: str, args: Mapping[str, Any], tenant: str) -> DryRunResult:
        """Read-only preview of ``execute``; deterministic for a given provider state (C5)."""
        ...

    def execute(
        self,
        tool: str,
        target: str,
        args: Mapping[str, Any],
        tenant: str,
        token: str,
        invocation_id: str,
    ) -> ExecutionResult:
        """Apply the effect; ``token`` is callgate's idempotency token, passed through."""
        ...

    def lookup(self, token: str, tool: str = "") -> Lookup:
        """Was an effect applied with ``token``? Used before any retry (C12).

        ``tool`` is the catalog tool the token was executed for: a provider fronting many
        tools (an MCP upstream) reconciles through that tool's declared lookup.
        """
        ...


@dataclass(frozen=True)
class ResourceDescription:
    """What the system of record says about one resource (C7).

    ``tenant`` is the owning tenant (``None``: nobody owns it, or it does not exist);
    ``attributes`` are plain JSON values the policy may use (``resource.<name>``).
    """

    found: bool
    tenant: str | None
    attributes: dict[str, Any]


@runtime_checkable
class Describes(Protocol):
    """A provider that can describe a resource (the HTTP provider's ``/describe``)."""

    def describe(self, tool: str, target: str) -> ResourceDescription:
        """Owner and attributes of ``target``; ``ProviderError`` when unreachable."""
        ...
