"""``gateway_two_deciders``: two workers decide for the pool; one's decider child is killed (kill
-9) while calls go through the gateway. The survivor keeps routing what it owns, the killed
one's supervisor starts a new child."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from lab.faults import log
from lab.faults.gateway_harness import GatewayRun, GatewayScenario
from lab.faults.tally import handover_gaps, longest_pause

DOCUMENTS = 16  # long system prompts: the calls spread over the partitions, so over both deciders


async def _body(run: GatewayRun) -> None:
    """A second worker (``GatewayRun.second_worker``) joins the stack's; 8 s for the deciders'
    group to share the partitions; 300 calls over 100 s, each with one of 16 long system prompts
    (``Callers``' ``documents``: spread over the partitions, so over both deciders); at 35 s the
    first worker's decider child is killed. ``survivor_gap_s`` / ``takeover_gap_s``:
    ``lab.faults.tally.handover_gaps`` over [kill, kill + 20 s] (the survivor's longest pause on
    partitions it decided before and after; the killed one's partitions' longest wait for a
    decision by another decider). Targets: 0 failed calls, survivor gap <= 2 s."""
    _process, marker = await run.second_worker()
    await asyncio.sleep(8.0)
    survivor_pid = run.decider_pid(marker)
    traffic = asyncio.create_task(run.traffic_for(100.0, documents=DOCUMENTS))
    try:
        await asyncio.sleep(35.0)
        before = run.part("worker").child_restarts
        victim_pid = run.decider_pid()
        killed_at = run.fault_start = time.time()
        os.kill(victim_pid, signal.SIGKILL)
        log(f"{run.name}: killed the first worker's decider (pid {victim_pid}); survivor {survivor_pid}")
        run.fault_end = await run.decider_back(before)
    finally:
        await traffic
    assert run.collector is not None
    decisions = run.collector.decisions
    workers = {d.worker for d in decisions}
    survivor = next((w for w in workers if w.endswith(f":{survivor_pid}")), "")
    victim = next((w for w in workers if w.endswith(f":{victim_pid}")), "")
    run.extra["deciding_before_kill"] = len({d.worker for d in decisions if d.at < killed_at})
    gaps = handover_gaps(decisions, killed_at, killed_at + 20.0, survivor, victim)
    run.extra["survivor_gap_s"], run.extra["takeover_gap_s"] = (
        None if g is None else round(g, 2) for g in gaps
    )
    # The same pause on the survivor's partitions over 22 s before the kill: at a few calls a
    # second over four partitions, a partition's decisions are seconds apart without any fault.
    kept = {d.partition for d in decisions if d.worker == survivor and d.at < killed_at}
    pauses = [
        longest_pause((d.at for d in decisions if d.partition == p), killed_at - 24.0, killed_at - 2.0)
        for p in kept
    ]
    run.extra["survivor_gap_before_kill_s"] = round(max(pauses), 2) if pauses else None


gateway_two_deciders = GatewayScenario(_body)
