"""Provider name → provider; the executor resolves a tool's provider here.

A tool names its provider (``provider: crm``); the profile's ``providers:`` map gives each
name a ``kind`` and that kind's settings:

```yaml
providers:
  tickets: {kind: simulated}
  crm: {kind: http, base_url: "https://crm.internal", credentials: {env: CRM_TOKEN}}
```

Each kind is a ``ProviderKind``: a name, a pydantic settings model and a ``build``
function. ``PROVIDER_KINDS`` lists the kinds callgate ships (``simulated``, ``http``,
``mcp``); a new
kind is one more entry. ``build_registry`` validates every entry against its kind's model
(an unknown kind or a bad setting is a ``ProfileError`` naming the key) and builds the
providers. A profile without ``providers:`` gets the bundled simulations under their own
names. Built once at the composition root and passed down; no module-level instances.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from callgate.domain.catalog import Profile, ProfileError
from callgate.providers.base import Provider
from callgate.providers.channels import Channels
from callgate.providers.http import HttpProvider
from callgate.providers.ledger import EffectLedger
from callgate.providers.secrets import Secret
from callgate.providers.simulated import SIMULATED, FaultPlan
from callgate.providers.upstream_tokens import UpstreamTokenConfig, build_upstream_tokens

P = TypeVar("P")


class ProviderRegistry:
    def __init__(self, providers: Iterable[Provider] = ()) -> None:
        self._providers: dict[str, Provider] = {}
        for provider in providers:
            if provider.name in self._providers:
                raise ValueError(f"duplicate provider name {provider.name!r}")
            self._providers[provider.name] = provider

    @classmethod
    def simulated(
        cls,
        ledger: EffectLedger,
        faults: FaultPlan | Mapping[str, Any] | None = None,
        rng: random.Random | None = None,
    ) -> ProviderRegistry:
        """The five bundled simulations over one ledger.

        Each provider gets its own ``random.Random`` seeded from the plan's seed and its
        name (so one provider's calls do not shift another's faults) unless ``rng`` is
        given, which is then shared.
        """
        plan = faults if isinstance(faults, FaultPlan) else FaultPlan.from_mapping(faults or {})
        return cls(
            sim(
                ledger, plan.for_provider(sim.name), rng or random.Random(f"{plan.seed}:{sim.name}")
            )
            for sim in SIMULATED
        )

    def close(self) -> None:
        """Close what providers hold open (upstream sessions); safe to call twice."""
        for provider in self._providers.values():
            close = getattr(provider, "close", None)
            if callable(close):
                close()

    def get(self, name: str) -> Provider:
        """The provider called ``name``; ``KeyError`` when there is none."""
        try:
            return self._providers[name]
        except KeyError:
            raise KeyError(f"no provider named {name!r}") from None

    def for_tool(self, tool: str) -> Provider:
        return self.get(tool.split(".", 1)[0])

    def with_provider(self, provider: Provider) -> ProviderRegistry:
        """A copy where ``provider`` replaces (or adds) the one with its name."""
        return ProviderRegistry({**self._providers, provider.name: provider}.values())

    def routing(self, profile: Profile) -> ProviderRegistry:
        """The same providers, routing tools as ``profile`` describes them (a published
        policy version, ADR 0067): each MCP provider a copy with that profile's entries,
        sharing its upstream connection; the others as they are."""
        from callgate.providers.mcp import McpProvider
        from callgate.providers.metrics import rewrapped, unwrapped

        routed: list[Provider] = []
        for provider in self._providers.values():
            inner = unwrapped(provider)
            if isinstance(inner, McpProvider):
                tools = {n: t for n, t in profile.tools.items() if t.provider == inner.name}
                provider = rewrapped(provider, inner.routing(tools))
            routed.append(provider)
        return ProviderRegistry(routed)

    def names(self) -> list[str]:
        return sorted(self._providers)

    def of_kind(self, kind: type[P]) -> list[P]:
        """The providers of class ``kind``, each itself (outside its timing wrapper)."""
        from callgate.providers.metrics import unwrapped

        found = (unwrapped(p) for p in self._providers.values())
        return [p for p in found if isinstance(p, kind)]

    def __contains__(self, name: object) -> bool:
        return name in self._providers

    def __iter__(self) -> Iterator[Provider]:
        return iter(self._providers.values())


# --- provider kinds -------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildContext:
    """What building a provider may use; the ledger is opened only when a kind needs it."""

    ledger: Callable[[], EffectLedger]
    faults: FaultPlan
    environ: Mapping[str, str]
    profile_dir: Path
    profile: Profile | None = None  # the catalog an upstream's tools come from (mcp)
    channels: Channels = field(default_factory=Channels)  # to agents waiting here (mcp)


class ProviderKind(Protocol):
    name: str
    settings: type[BaseModel]

    def build(self, name: str, settings: Any, context: BuildContext) -> Provider: ...


class _Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SimulatedSettings(_Settings):
    kind: Literal["simulated"]
    simulation: str | None = Field(default=None, description="bundled simulation; the name")


class SimulatedKind:
    """The bundled simulations over the durable effect ledger, with fault injection."""

    name = "simulated"
    settings: type[BaseModel] = SimulatedSettings

    def build(self, name: str, settings: Any, context: BuildContext) -> Provider:
        wanted = settings.simulation or name
        by_name = {sim.name: sim for sim in SIMULATED}
        if wanted not in by_name:
            raise ValueError(f"no bundled simulation {wanted!r} (one of {', '.join(by_name)})")
        plan = context.faults
        provider = by_name[wanted](
            context.ledger(), plan.for_provider(name), random.Random(f"{plan.seed}:{name}")
        )
        provider.name = name
        return provider


class HttpSettings(_Settings):
    kind: Literal["http"]
    base_url: str = Field(pattern=r"^https?://[^\s/]+", description="protocol root URL")
    credentials: Secret | None = None
    timeout_s: float = Field(default=10.0, gt=0, le=300)
    retries: int = Field(default=0, ge=0, le=10, description="repeats of read-only calls")
    # A token obtained per call instead of ``credentials`` (ADR 0081).
    upstream_token: UpstreamTokenConfig | None = None

    @model_validator(mode="after")
    def _one_authorization(self) -> HttpSettings:
        if self.credentials is not None and self.upstream_token is not None:
            raise ValueError("give either 'credentials' or 'upstream_token', not both")
        return self


class HttpKind:
    """A provider behind HTTP (docs/provider-http.openapi.yaml)."""

    name = "http"
    settings: type[BaseModel] = HttpSettings

    def build(self, name: str, settings: Any, context: BuildContext) -> Provider:
        credential = (
            settings.credentials.read(context.environ, context.profile_dir)
            if settings.credentials is not None
            else None
        )
        tokens = (
            build_upstream_tokens(
                name, settings.upstream_token, context.environ, context.profile_dir
            )
            if settings.upstream_token is not None
            else None
        )
        return HttpProvider(
            name, settings.base_url, settings.timeout_s, settings.retries, credential, tokens
        )


class McpSettings(_Settings):
    """An upstream MCP server (``command`` or ``url``); ``providers.mcp`` checks the rest."""

    model_config = ConfigDict(frozen=True, extra="allow")
    kind: Literal["mcp"]


class McpKind:
    """An upstream MCP server whose tools the catalog names (``callgate.providers.mcp``).
    Its session opens lazily, on the first call."""

    name = "mcp"
    settings: type[BaseModel] = McpSettings

    def build(self, name: str, settings: Any, context: BuildContext) -> Provider:
        from callgate.providers.mcp import McpProvider
        from callgate.providers.mcp_upstream import McpUpstream, McpUpstreamConfig

        config = McpUpstreamConfig.parse(name, settings.model_dump())
        tokens = (
            build_upstream_tokens(name, config.upstream_token, context.environ, context.profile_dir)
            if config.upstream_token is not None
            else None
        )
        upstream = McpUpstream(name, config, tokens)
        catalog = context.profile.tools if context.profile is not None else {}
        tools = {t: spec for t, spec in catalog.items() if spec.provider == name}
        return McpProvider(name, upstream, tools, context.channels)


PROVIDER_KINDS: tuple[ProviderKind, ...] = (SimulatedKind(), HttpKind(), McpKind())


def _implicit() -> dict[str, dict[str, Any]]:
    """No ``providers:`` in the profile: the bundled simulations under their own names."""
    return {sim.name: {"kind": "simulated"} for sim in SIMULATED}


def provider_settings(
    profile: Profile, kinds: Iterable[ProviderKind] = PROVIDER_KINDS
) -> dict[str, tuple[ProviderKind, BaseModel]]:
    """Every ``providers:`` entry checked against its kind's model (``ProfileError``)."""
    by_kind = {k.name: k for k in kinds}
    entries = profile.providers if profile.providers is not None else _implicit()
    out: dict[str, tuple[ProviderKind, BaseModel]] = {}
    for name, raw in entries.items():
        where = f"profile {profile.source}: providers.{name}"
        kind_name = raw.get("kind")
        kind = by_kind.get(kind_name) if isinstance(kind_name, str) else None
        if kind is None:
            known = ", ".join(sorted(by_kind))
            raise ProfileError(f"{where}.kind: unknown provider kind {kind_name!r} ({known})")
        try:
            out[name] = (kind, kind.settings.model_validate(raw))
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ProfileError(f"{where}.{loc}: {first['msg']}") from None
    return out


def build_registry(
    profile: Profile,
    context: BuildContext,
    kinds: Iterable[ProviderKind] = PROVIDER_KINDS,
) -> ProviderRegistry:
    """The profile's providers, built (``ProfileError`` naming the key on any problem)."""
    built = []
    for name, (kind, settings) in provider_settings(profile, kinds).items():
        try:
            built.append(kind.build(name, settings, context))
        except ValueError as exc:
            raise ProfileError(f"profile {profile.source}: providers.{name}: {exc}") from None
    return ProviderRegistry(built)


def default_context(
    ledger: Callable[[], EffectLedger],
    faults: Mapping[str, Any],
    profile: Profile,
    channels: Channels | None = None,
) -> BuildContext:
    return BuildContext(
        ledger=ledger,
        faults=FaultPlan.from_mapping(faults),
        environ=os.environ,
        profile_dir=profile.source.parent,
        profile=profile,
        channels=channels if channels is not None else Channels(),
    )
