"""``dispatcher_kill``: the dispatcher (the process that runs decisions on the engines) dies
mid-run (kill -9) and a new one starts, as a supervisor would restart it."""

from __future__ import annotations

import asyncio
import time

from lab.faults import FLEET, PARTITIONS
from lab.faults.harness import Run

_ENV = {"TOKENFLEET_DISPATCHER_WEB_PORT": "0", "TOKENFLEET_TOPIC_PARTITIONS": str(PARTITIONS)}


async def dispatcher_kill(run: Run) -> None:
    """A worker, and the emulated fleet as its own process (``tokenfleet fleet``); steady
    traffic for 40 s; at 15 s the fleet is killed (SIGKILL: its emulated engines and whatever
    it had running die with it) and a new one started at once. ``in_flight_at_kill``: requests
    decided and not completed when it was killed, as the log showed then (an upper bound of
    what it had running): the most that may run twice. Every client still gets one answer."""
    await run.stack.start_broker()
    await run.start_clients()
    worker = run.stack.start_worker()
    await worker.wait_ready_async(90)
    args = ["fleet", "--fleet", FLEET]
    first = run.stack.start_service(args, _ENV, "fleet-first.log")
    await run.warm_up(timeout_s=90)
    assert run.collector is not None
    collector = run.collector
    publishing = asyncio.create_task(run.steady("s", 40))
    try:
        await asyncio.sleep(15)
        decided = {d.key for d in collector.decisions}
        completed = {key for key, _, _ in collector.completions}
        killed_at = time.time()
        first.process.kill()
        await asyncio.to_thread(first.process.wait, 10)
        run.stack.start_service(args, _ENV, "fleet-second.log")
        run.fault_start = killed_at
        run.extra["in_flight_at_kill"] = len(decided - completed)
    finally:
        await asyncio.wait_for(publishing, timeout=60)
    await run.settle(timeout_s=90)
