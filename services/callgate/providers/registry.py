"""Provider name → provider; the executor resolves a tool's provider here.

A tool ``refunds.issue`` belongs to provider ``refunds`` unless the catalog names another
(``for_tool`` uses the prefix before the first dot). Built once at the composition root
and passed down; no module-level registry.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from callgate.providers.base import Provider
from callgate.providers.ledger import EffectLedger
from callgate.providers.simulated import SIMULATED, FaultPlan

if TYPE_CHECKING:
    from callgate.domain.catalog import Profile


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

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        ledger: EffectLedger,
        faults: FaultPlan | Mapping[str, Any] | None = None,
    ) -> ProviderRegistry:
        """The bundled simulations plus the providers the profile declares (``providers:``).

        A declared provider replaces a simulation of the same name. Kinds: ``simulated``
        (the bundled one of that name), ``http`` (``url``, ``timeout_s``) and ``mcp`` (an
        upstream MCP server, ``command`` or ``url``; see ``callgate.providers.mcp``).
        Upstream sessions open lazily, on the first call.
        """
        registry = cls.simulated(ledger, faults)
        for name, body in profile.providers.items():
            kind = body["kind"]
            if kind == "simulated":
                if name not in registry:
                    raise ValueError(f"provider '{name}': no bundled simulation of that name")
                continue
            if kind == "http":
                from callgate.providers.http import HttpProvider

                url = body.get("url")
                if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                    raise ValueError(f"provider '{name}': field 'url': an http(s) URL is required")
                registry = registry.with_provider(
                    HttpProvider(name, url, float(body.get("timeout_s", 10.0)))
                )
                continue
            from callgate.providers.mcp import McpProvider, McpUpstream, McpUpstreamConfig

            upstream = McpUpstream(name, McpUpstreamConfig.parse(name, body))
            tools = {t: spec for t, spec in profile.tools.items() if spec.provider == name}
            registry = registry.with_provider(McpProvider(name, upstream, tools))
        return registry

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

    def names(self) -> list[str]:
        return sorted(self._providers)

    def __contains__(self, name: object) -> bool:
        return name in self._providers

    def __iter__(self) -> Iterator[Provider]:
        return iter(self._providers.values())
