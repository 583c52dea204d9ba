"""The SDK ``Gateway`` on one thread of its own, awaited from the MCP server's event loop.

The gateway's backends hold a SQLite connection or Kafka clients, which belong to the
thread that made them; and a proposal blocks until it settles. So every gateway call
runs on one dedicated worker thread, in arrival order, and the MCP handlers await it
without blocking the loop (other sessions keep being served meanwhile).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from callgate.surfaces.gateway import Gateway, Surface

T = TypeVar("T")


class GatewayBridge:
    def __init__(self, app: Surface) -> None:
        self.app = app
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="callgate-gateway")
        self._gate: Gateway | None = None
        self.closed = threading.Event()

    def _gateway(self) -> Gateway:
        if self._gate is None:  # made on the worker thread, used only there
            self._gate = self.app.gateway()
        return self._gate

    def call(self, call: Callable[[Gateway], T]) -> T:
        """``run`` from a thread of its own (the pinning watcher)."""
        return self._pool.submit(lambda: call(self._gateway())).result()

    async def run(self, call: Callable[[Gateway], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: call(self._gateway()))

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
            )
        )

    def close(self) -> None:
        self.closed.set()

        def shut() -> None:
            if self._gate is not None:
                self._gate.close()
            self._gate = None

        self._pool.submit(shut).result()
        self._pool.shutdown(wait=True)
        self.app.providers.close()
