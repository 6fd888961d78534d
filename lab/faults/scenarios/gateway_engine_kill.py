"""``gateway_engine_kill``: an emulated engine server killed (kill -9) while calls go through the
gateway; the gateway re-places what the engine held, and ``up``'s supervisor restarts it."""

from __future__ import annotations

import asyncio

from lab.faults.gateway_harness import GatewayRun, GatewayScenario

ENGINE = "emulated-0"


async def _body(run: GatewayRun) -> None:
    """300 calls over 100 s; at 35 s ``emulated-0`` is killed. ``fault_end``: the supervisor
    restarted it and it answers ``/health``. Target: 0 failed calls."""
    traffic = asyncio.create_task(run.traffic_for(100.0))
    try:
        await asyncio.sleep(35.0)
        restarts = run.part(ENGINE).restarts
        run.fault_start = run.kill(ENGINE)
        run.fault_end = await run.back(ENGINE, restarts)
    finally:
        await traffic
    assert run.counts is not None
    run.extra["engine_processes_seen"] = 1 + run.counts.restarts_seen[ENGINE]


gateway_engine_kill = GatewayScenario(_body)
