"""``store_down_at_start``: the store is unreachable from a worker's start; its feedback spools
and reaches the store once a worker with a reachable one takes over."""

from __future__ import annotations

import asyncio
import time

from infra.kafka.broker import free_port
from lab.faults.harness import Run, spool_segments
from lab.faults.tally import p99, rounded, window_latencies


async def store_down_at_start(run: Run) -> None:
    """A worker whose store is unreachable (``http://127.0.0.1:<free port>``, nothing listens)
    routes 15 s of steady traffic (feedback spools to ``<data_dir>/spool``) and is stopped; a
    worker with the embedded store on the same data dir takes over (traffic goes on) and drains
    the spool. ``spool_drained_s``: its readiness -> no spool segment left."""
    await run.stack.start_broker()
    await run.start_clients()
    down = run.stack.start_worker(clickhouse=f"http://127.0.0.1:{free_port()}")
    await down.wait_ready_async(90)
    await run.start_fleet()
    await run.warm_up()
    t0 = time.time()
    publishing = asyncio.create_task(run.steady("s", 35))
    try:
        await asyncio.sleep(15)
        down_until = time.time()
        await run.stack.stop_worker(down)
        segments = spool_segments(run.data_dir)
        run.extra["spool_segments"] = len(segments)
        run.extra["spooled_completions"] = sum(
            len(p.read_bytes().splitlines()) for p in segments if p.name.endswith("-completions.jsonl")
        )
        embedded = run.stack.start_worker()
        await embedded.wait_ready_async(90)
        ready_at = time.time()
        run.window, run.fault_end = (t0, ready_at), ready_at
    finally:
        await asyncio.wait_for(publishing, timeout=60)
    await run.settle()
    assert run.publisher is not None and run.collector is not None
    first = {d.key: d.at for d in reversed(run.collector.decisions)}
    run.extra["routing_p99_store_down_s"] = rounded(
        p99(window_latencies(run.publisher.valid, first, t0, down_until))
    )
    drained = await run.until(lambda: not spool_segments(run.data_dir), 90)
    run.extra["spool_drained_s"] = round(time.time() - ready_at, 3) if drained else None
    await asyncio.sleep(2.0)  # the last batch written before its segment went is committed
