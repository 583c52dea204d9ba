"""The MCP server's gateway lanes: a call that blocks does not hold up another agent's."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from callgate.application.client import Gateway
from callgate.bootstrap import Settings, bootstrap
from callgate.surfaces.mcp.bridge import GatewayBridge


def test_a_blocked_call_does_not_hold_up_another_agents_call(tmp_path: Path) -> None:
    bridge = GatewayBridge(bootstrap(Settings(state_dir=tmp_path / "state", dev=True)), lanes=2)
    release = threading.Event()
    threads: list[str] = []

    def slow(g: Gateway) -> str:
        threads.append(threading.current_thread().name)
        release.wait(10)  # a proposal waiting to settle
        return "slow"

    def quick(g: Gateway) -> str:
        threads.append(threading.current_thread().name)
        return "quick"

    async def both() -> tuple[str, str]:
        blocked = asyncio.ensure_future(bridge.run(slow))
        await asyncio.sleep(0.05)
        answered = await asyncio.wait_for(bridge.run(quick), 5)  # while ``slow`` blocks
        assert not blocked.done()
        release.set()
        return await blocked, answered

    try:
        assert asyncio.run(both()) == ("slow", "quick")
        assert len(set(threads)) == 2  # two lanes, each its own thread and gateway
    finally:
        release.set()
        bridge.close()


def test_one_agent_at_a_time_uses_one_lane(tmp_path: Path) -> None:
    """Sequential calls reuse the first lane: no second backend is opened for nothing."""
    bridge = GatewayBridge(bootstrap(Settings(state_dir=tmp_path / "state", dev=True)), lanes=4)

    async def three() -> list[str]:
        return [await bridge.run(lambda g: threading.current_thread().name) for _ in range(3)]

    try:
        assert len(set(asyncio.run(three()))) == 1
    finally:
        bridge.close()
