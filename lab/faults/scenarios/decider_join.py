"""``decider_join``: a second worker joins under load and takes its share of the pool's
partitions, with no request lost or decided twice."""

from __future__ import annotations

import asyncio
import time

from lab.faults.harness import Run, started
from lab.faults.tally import longest_pause


async def decider_join(run: Run) -> None:
    """One worker decides the pool's requests (spread over every partition); steady traffic
    for 40 s; at 10 s a second worker of the same app starts (its own data dir and store).
    Who owns a partition after the join is read from the run's last 10 s of decisions (the new
    worker takes its share only once it is ready and the group has rebalanced, some seconds
    after it started). ``survivor_gap_s``: the longest routing pause, from 2 s before the join
    to the end of traffic, on a partition the first worker kept; ``takeover_gap_s``: the same
    on the partitions that moved to the new worker."""
    first = await started(run)
    first_pid = first.child_pid()
    publishing = asyncio.create_task(run.steady("s", 40))
    try:
        await asyncio.sleep(10)
        joined_at = time.time()
        second = run.stack.start_worker(data_dir=run.data_dir / "second")
        await second.wait_ready_async(90)
        run.window = (joined_at, joined_at + 25.0)
        run.fault_start = run.fault_end = joined_at
    finally:
        await asyncio.wait_for(publishing, timeout=60)
    await run.settle()
    assert run.collector is not None
    decisions = run.collector.decisions
    end = max((d.at for d in decisions), default=joined_at)
    owner = {d.partition: d.worker for d in sorted(decisions, key=lambda d: d.at) if d.at >= end - 10.0}
    kept = {p for p, worker in owner.items() if worker.endswith(f":{first_pid}")}
    moved = set(owner) - kept
    run.extra["workers_deciding"] = len({d.worker for d in decisions})
    run.extra["partitions_moved"] = len(moved)

    def gap(partitions: set[int]) -> float | None:
        if not partitions:
            return None
        pauses = [
            longest_pause((d.at for d in decisions if d.partition == p), joined_at - 2.0, end)
            for p in partitions
        ]
        return round(max(pauses), 2)

    run.extra["survivor_gap_s"], run.extra["takeover_gap_s"] = gap(kept), gap(moved)
