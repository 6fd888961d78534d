"""``broker_restart``: the broker goes away with its log and a new, empty one takes its port; the
worker, the fleet and the publisher reconnect on their own."""

from __future__ import annotations

import asyncio
import time

from lab.faults import log
from lab.faults.clients import BrokerLog
from lab.faults.harness import Run, started


async def broker_restart(run: Run) -> None:
    """Steady traffic for 45 s; at 12 s the broker is stopped (its in-memory log goes with it)
    and 1 s later a new embedded broker is started on the same port; the suite creates the
    topics again (the old broker's metadata is gone too). The worker, fleet and collector are
    left to reconnect on their own. ``lost_with_broker_log``: lost requests the old broker had
    acknowledged; ``lost_after_restart``: lost requests the new broker acknowledged."""
    await started(run)
    port = run.stack.broker.port
    publishing = asyncio.create_task(run.steady("s", 45))
    try:
        await asyncio.sleep(12)
        run.broker_stopped_at = time.time()
        await asyncio.to_thread(run.stack.stop_broker)
        log(f"{run.name}: broker stopped")
        await asyncio.sleep(1.0)
        for attempt in range(10):
            try:
                await run.stack.start_broker(port)
                break
            except Exception as exc:
                log(f"{run.name}: broker restart attempt {attempt + 1} failed: {exc}")
                await asyncio.sleep(1.0)
        else:
            raise RuntimeError(f"no broker could be started again on port {port}")
        log(f"{run.name}: broker back on port {port}")
        assert run.collector is not None
        await run.collector.restart()
        run.fault_start = run.broker_stopped_at
        run.window = (run.broker_stopped_at, time.time())
        run.fault_end = run.window[1]
    finally:
        await asyncio.wait_for(publishing, timeout=90)
    await run.settle(timeout_s=60)
    worker = run.workers[-1]
    run.extra["worker_alive"] = worker.process.poll() is None
    run.served = await BrokerLog.read(run.bootstrap)
