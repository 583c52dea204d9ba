"""SDK ``Gateway``s on lanes of their own, awaited from the MCP server's event loop.

A gateway's backend holds a SQLite connection or Kafka clients, which belong to the
thread that made them, and a proposal blocks until it settles. So each lane is one
worker thread with its own gateway, made on first use. A call goes to the lane with the
fewest calls in flight, so calls from different agents run side by side. What C12 orders
is ordered by the deciders, not here: on the embedded store the lanes take turns holding
the runner and each runs whatever is on the log. The MCP handlers await the lanes
without blocking the loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from callgate.application.client import Gateway
from callgate.providers.channels import Channel
from callgate.surfaces.ports import Surface

T = TypeVar("T")


class _Lane:
    """One worker thread and the gateway made on it."""

    def __init__(self, app: Surface, n: int) -> None:
        self.app = app
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"callgate-gateway-{n}")
        self.gate: Gateway | None = None
        self.in_flight = 0

    def gateway(self) -> Gateway:
        if self.gate is None:  # made on the lane's thread, used only there
            self.gate = self.app.gateway()
        return self.gate

    def close(self) -> None:
        def shut() -> None:
            if self.gate is not None:
                self.gate.close()
            self.gate = None

        self.pool.submit(shut).result()
        self.pool.shutdown(wait=True)


class GatewayBridge:
    # Agents served side by side; each lane in use holds a backend (a SQLite connection,
    # or Kafka clients), made when a call first needs it.
    LANES = 8

    def __init__(self, app: Surface, lanes: int = LANES) -> None:
        self.app = app
        self._lanes = [_Lane(app, n) for n in range(max(1, lanes))]
        self._choose = threading.Lock()
        self.closed = threading.Event()

    def _lane(self) -> _Lane:
        with self._choose:  # the least busy; ties to the first, so one agent uses one lane
            lane = min(self._lanes, key=lambda la: la.in_flight)
            lane.in_flight += 1
            return lane

    def _done(self, lane: _Lane) -> None:
        with self._choose:
            lane.in_flight -= 1

    def call(self, call: Callable[[Gateway], T]) -> T:
        """``run`` from a thread of its own (the pinning watcher)."""
        lane = self._lane()
        try:
            return lane.pool.submit(lambda: call(lane.gateway())).result()
        finally:
            self._done(lane)

    async def run(self, call: Callable[[Gateway], T]) -> T:
        loop = asyncio.get_running_loop()
        lane = self._lane()
        try:
            return await loop.run_in_executor(lane.pool, lambda: call(lane.gateway()))
        finally:
            self._done(lane)

    async def propose(
        self,
        session: str,
        tool: str,
        args: dict[str, Any],
        idempotency_key: str | None,
        approval_id: str | None,
        timeout_s: float,
        traceparent: str | None = None,
        trace_attributes: Mapping[str, Any] | None = None,
        channel: Channel | None = None,
    ) -> dict[str, Any]:
        return await self.run(
            lambda g: g.propose(
                session,
                tool,
                args,
                idempotency_key=idempotency_key,
                approval_id=approval_id,
                timeout_s=timeout_s,
                traceparent=traceparent,
                trace_attributes=trace_attributes,
                channel=channel,
            )
        )

    def close(self) -> None:
        self.closed.set()
        for lane in self._lanes:
            lane.close()
        self.app.providers.close()
