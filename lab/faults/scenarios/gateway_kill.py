"""``gateway_kill``: the gateway killed (kill -9) while calls go through it; ``up``'s supervisor
restarts it and the clients reconnect."""

from __future__ import annotations

import asyncio

from lab.faults.gateway_harness import GatewayRun, GatewayScenario
from lab.faults.gateway_tally import held_at


async def _body(run: GatewayRun) -> None:
    """300 calls over 100 s; at 35 s the gateway is killed. ``fault_end``: it is back and its
    ``/ready`` answers 200. ``held``: calls with an attempt in the gateway at the kill;
    ``failed_held`` / ``failed_not_held``: the failed calls among them / the others (calls that
    found no gateway for their every attempt: its downtime outlasted the client's retries).
    Target: only the calls it held fail."""
    traffic = asyncio.create_task(run.traffic_for(100.0))
    try:
        await asyncio.sleep(35.0)
        restarts = run.part("gateway").restarts
        killed_at = run.fault_start = run.kill("gateway")
        run.fault_end = await run.back("gateway", restarts)
    finally:
        await traffic
    held = held_at(run.calls, killed_at)
    failed = {c.call_id for c in run.calls if c.outcome == "failed"}
    run.extra["held"] = len(held)
    run.extra["failed_held"] = len(failed & held)
    run.extra["failed_not_held"] = len(failed - held)
    run.extra["gateway_down_s"] = round(run.fault_end - killed_at, 2)


gateway_kill = GatewayScenario(_body)
