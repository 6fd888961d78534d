"""``decider_failover``: two workers decide for one pool at once; one is killed (kill -9) under
load, and the survivor goes on routing its partitions while it takes over the dead one's."""

from __future__ import annotations

import asyncio
import time

from lab.faults.harness import Run, started
from lab.faults.tally import handover_gaps


async def decider_failover(run: Run) -> None:
    """Two workers of one app (each its own data dir and embedded store), the pool's requests
    spread over every partition by their prompt prefix; steady traffic for 40 s; at 15 s one
    worker is killed (SIGKILL) and not replaced. ``survivor_gap_s``: the longest routing pause,
    from 2 s before the kill to 20 s after, on a partition the survivor decided before and after
    the kill; ``takeover_gap_s``: over the dead worker's partitions, the longest time from the
    kill to the first decision on it by the survivor."""
    first = await started(run)
    second = run.stack.start_worker(data_dir=run.data_dir / "second")
    await second.wait_ready_async(90)
    await asyncio.sleep(8.0)  # the deciders' group gives the second worker its share
    survivor_pid, victim_pid = first.child_pid(), second.child_pid()
    publishing = asyncio.create_task(run.steady("s", 40))
    try:
        await asyncio.sleep(15)
        killed_at = time.time()
        await run.stack.stop_worker(second, kill=True)
        run.window = (killed_at, killed_at + 20.0)
        run.fault_start = run.fault_end = killed_at
    finally:
        await asyncio.wait_for(publishing, timeout=60)
    await run.settle()
    assert run.collector is not None
    decisions = run.collector.decisions
    workers = {d.worker for d in decisions}
    survivor = next((w for w in workers if w.endswith(f":{survivor_pid}")), "")
    victim = next((w for w in workers if w.endswith(f":{victim_pid}")), "")
    run.extra["workers_deciding"] = len(workers)
    run.extra["deciding_before_kill"] = len({d.worker for d in decisions if d.at < killed_at})
    gaps = handover_gaps(decisions, killed_at, killed_at + 20.0, survivor, victim)
    run.extra["survivor_gap_s"], run.extra["takeover_gap_s"] = (
        None if g is None else round(g, 2) for g in gaps
    )
