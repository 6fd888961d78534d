"""``gateway_dispatcher_kill``: the dispatcher (the engine port of the Kafka path) killed (kill -9)
while calls go through the gateway; ``up``'s supervisor restarts it."""

from __future__ import annotations

import asyncio

from lab.faults.gateway_harness import GatewayRun, GatewayScenario


async def _body(run: GatewayRun) -> None:
    """300 calls over 100 s; at 35 s the dispatcher is killed. ``fault_end``: it is back and
    ready. The gateway runs its calls on the engines itself: target 0 failed calls."""
    traffic = asyncio.create_task(run.traffic_for(100.0))
    try:
        await asyncio.sleep(35.0)
        restarts = run.part("dispatcher").restarts
        run.fault_start = run.kill("dispatcher")
        run.fault_end = await run.back("dispatcher", restarts)
    finally:
        await traffic


gateway_dispatcher_kill = GatewayScenario(_body)
