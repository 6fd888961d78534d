"""``store_down_mid_run``: the store fails every call for a minute while the worker routes; its
feedback spools meanwhile and drains once the store is back. Judged against a control run."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from lab.faults import log
from lab.faults.harness import Run, spool_segments
from lab.faults.tally import p99, rounded, window_latencies

STORE_OUTAGE_S = 60.0
ROOT = Path(__file__).resolve().parents[3]  # the checkout the workers import the project from


async def store_down_mid_run(run: Run) -> None:
    """A worker with the embedded store routes 100 s of steady traffic; from 15 s on, for 60 s,
    every call it makes to ClickHouse fails (``sitecustomize.py`` of ``run.inject_dir``: the
    error a client gets from a server that went away, injected at the client edge inside the
    worker, since the embedded engine cannot be stopped apart from it). ``spool_drained_s``: the
    store's return -> no spool segment left.

    The reference the outage's latency is judged against is a *control run*: the same traffic
    on a fresh broker and worker with no outage, its p99 over the same seconds of its run
    (``routing_p99_control_s``; ``routing_p99_ratio`` = outage / control). Not the seconds
    before the outage: the embedded broker's CPU grows with its in-memory log (measured 8 % of
    a core 10 s into this scenario, 79 % at 100 s), so every later window is slower than an
    earlier one, outage or not. ``routing_p99_before_s`` / ``_after_s``: the outage run's 15 s
    before and 25 s after the outage, for reference."""
    if run.inject_dir is None:
        raise RuntimeError("store_down_mid_run needs the store-outage injection (Run.inject_dir)")
    # The control run first, alone on the machine.
    control = Run(f"{run.name}-control", run.data_dir / "control", inject_dir=run.inject_dir)
    control.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        reference = await _steady_with_store_outage(control, outage=False)
    finally:
        await control.close()
    timeline = await _steady_with_store_outage(run, outage=True)
    down, up = timeline["outage"]
    c_down, c_up = reference["outage"]
    assert control.publisher is not None and run.publisher is not None
    c_p99 = p99(window_latencies(control.publisher.valid, reference["first"], c_down, c_up))
    run.extra["routing_p99_control_s"] = rounded(c_p99)
    outage_p99 = p99(window_latencies(run.publisher.valid, timeline["first"], down, up))
    run.extra["routing_p99_ratio"] = None if not (c_p99 and outage_p99) else round(outage_p99 / c_p99, 2)


async def _steady_with_store_outage(run: Run, outage: bool) -> dict[str, Any]:
    """The traffic of ``store_down_mid_run`` on ``run``, with the store failing from 15 s to 75 s
    if ``outage``; returns the outage's (start, end) wall times and each key's first decision time.
    Both runs' workers carry the injection (the control's flag file is never created)."""
    assert run.inject_dir is not None
    flag = run.data_dir / "store-down"
    await run.stack.start_broker()
    await run.start_clients()
    worker = run.stack.start_worker(
        env={
            "PYTHONPATH": os.pathsep.join([str(run.inject_dir), str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "TOKENFLEET_FAULT_STORE_DOWN_FILE": str(flag),
        }
    )
    await worker.wait_ready_async(90)
    await run.start_fleet()
    await run.warm_up()
    t0 = time.time()
    publishing = asyncio.create_task(run.steady("s", STORE_OUTAGE_S + 40))
    try:
        await asyncio.sleep(15)
        if outage:
            flag.touch()
            log(f"{run.name}: store down")
        down_at = time.time()
        await asyncio.sleep(STORE_OUTAGE_S)
        if outage:
            run.extra["spool_segments"] = len(spool_segments(run.data_dir))
            flag.unlink()
            log(f"{run.name}: store back")
        up_at = time.time()
        if outage:
            run.window, run.fault_start, run.fault_end = (down_at, up_at), down_at, up_at
    finally:
        await asyncio.wait_for(publishing, timeout=60)
    end = time.time()
    await run.settle()
    assert run.publisher is not None and run.collector is not None
    first = {d.key: d.at for d in reversed(run.collector.decisions)}
    if outage:
        for name, (lo, hi) in {"before": (t0, down_at), "after": (up_at, end)}.items():
            latencies = window_latencies(run.publisher.valid, first, lo, hi)
            run.extra[f"routing_p99_{name}_s"] = rounded(p99(latencies))
        drained = await run.until(lambda: not spool_segments(run.data_dir), 90)
        run.extra["spool_drained_s"] = round(time.time() - up_at, 3) if drained else None
        await asyncio.sleep(2.0)  # the last batch written before its segment went is committed
    return {"outage": (down_at, up_at), "first": first}
