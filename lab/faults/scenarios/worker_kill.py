"""``worker_kill``: the worker dies mid-run (kill -9) and a replacement takes over its work."""

from __future__ import annotations

import asyncio
import time

from lab.faults.harness import Run, started


async def worker_kill(run: Run) -> None:
    """Steady traffic for 40 s; at 12 s the worker is killed (SIGKILL) and a new one (same app
    id, same data dir) started at once."""
    first = await started(run)
    publishing = asyncio.create_task(run.steady("s", 40))
    try:
        await asyncio.sleep(12)
        killed_at = time.time()
        await run.stack.stop_worker(first, kill=True)
        second = run.stack.start_worker()
        await second.wait_ready_async(90)
        run.window = (killed_at, time.time())
        run.fault_start, run.fault_end = killed_at, run.window[1]
    finally:
        await asyncio.wait_for(publishing, timeout=60)
    await run.settle()
    assert run.collector is not None
    run.extra["workers_deciding"] = len({d.worker for d in run.collector.decisions})
