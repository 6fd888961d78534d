"""``gateway_decider_kill``: the worker's decider child killed (kill -9) while calls go through the
gateway, one worker for the pool; the worker's supervisor starts a new child, and the calls wait
for it."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from lab.faults import log
from lab.faults.gateway_harness import GatewayRun, GatewayScenario


async def _body(run: GatewayRun) -> None:
    """300 calls over 100 s; at 35 s the decider child (the pid in the worker's ready marker) is
    killed. ``fault_end``: the worker's next child is ready (``status`` counts it in the
    worker's ``child_restarts``). Target: 0 failed calls (they wait for the restart)."""
    traffic = asyncio.create_task(run.traffic_for(100.0))
    try:
        await asyncio.sleep(35.0)
        before = run.part("worker").child_restarts
        pid = run.decider_pid()
        run.fault_start = time.time()
        os.kill(pid, signal.SIGKILL)
        log(f"{run.name}: killed the decider (pid {pid})")
        run.fault_end = await run.decider_back(before)
    finally:
        await traffic
    run.extra["decider_restarts_in_status"] = run.part("worker").child_restarts


gateway_decider_kill = GatewayScenario(_body)
