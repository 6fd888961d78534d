"""``held_restart``: requests held (no capacity yet) survive a graceful restart of the worker and
are routed once the fleet reports."""

from __future__ import annotations

import asyncio
import time

from lab.faults.harness import Run


async def held_restart(run: Run) -> None:
    """50 requests (class batch, deadline in 10 min: they do not time out while held) before
    any heartbeat, a graceful restart of the worker, then the fleet starts (heartbeats)."""
    await run.stack.start_broker()
    await run.start_clients()
    assert run.publisher is not None and run.collector is not None
    first = run.stack.start_worker()
    await first.wait_ready_async(90)
    t0 = time.time()
    held = [run.valid("h", i, slo_class="batch", deadline_ts=time.time() + 600) for i in range(50)]
    for request in held:
        run.publisher.request(request)
    await run.publisher.flush()
    keys = {(r.request_id, r.attempt) for r in held}
    collector = run.collector
    await run.until(lambda: collector.answered_admissions(keys) >= len(keys), 30)
    run.extra["held_answered_before_restart"] = collector.answered_admissions(keys)
    run.extra["decided_before_heartbeats"] = collector.decided(keys)
    await asyncio.sleep(1.5)  # the lane commits (below the held requests)
    await run.stack.stop_worker(first)
    second = run.stack.start_worker()
    await second.wait_ready_async(90)
    await run.start_fleet()
    run.window = (t0, time.time())
    run.fault_end = run.window[1]
    await run.settle()
