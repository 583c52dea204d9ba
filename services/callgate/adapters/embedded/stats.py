"""Figures of the embedded backend for the HTTP server's /metrics and /readyz."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from callgate.adapters.embedded.store import EmbeddedStore
from callgate.domain.process_port import Process


class EmbeddedStats:
    def __init__(
        self,
        store: EmbeddedStore,
        processes: Sequence[Process[Any]],
        runner_failure: Callable[[], str | None],
    ) -> None:
        self._store = store
        self._processes = list(processes)
        self._runner_failure = runner_failure

    def consumer_lag(self) -> dict[str, int]:
        return {p.name: self._store.backlog(p.name, p.inputs) for p in self._processes}

    def decisions(self) -> dict[tuple[str, str], int]:
        tally = self._store.view_tally("status", ("outcome", "tool"))
        return {(code, tool): n for (code, tool), n in tally.items()}

    def dead_letters(self) -> int:
        return self._store.count("dead-letter")

    def stalls(self) -> dict[str, int]:
        return {}  # one process, no client call that can wedge it

    def shadow_differed(self) -> int | None:
        return self._store.count_type("ShadowDecisionDiffered")

    def not_ready(self) -> str | None:
        return self._runner_failure()
