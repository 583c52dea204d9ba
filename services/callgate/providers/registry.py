"""Provider name → provider; the executor resolves a tool's provider here.

A tool ``refunds.issue`` belongs to provider ``refunds`` unless the catalog names another
(``for_tool`` uses the prefix before the first dot). Built once at the composition root
and passed down; no module-level registry.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from callgate.providers.base import Provider
from callgate.providers.ledger import EffectLedger
from callgate.providers.simulated import SIMULATED, FaultPlan


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
