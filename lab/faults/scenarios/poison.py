"""``poison``: single messages built to break a consumer (out-of-range fields, 5 MB); the
partition they are on must keep flowing."""

from __future__ import annotations

import asyncio
import time

from lab.faults import MODEL
from lab.faults.harness import Run, started
from lab.faults.messages import poison_pills


async def poison(run: Run) -> None:
    """Each poison pill (``attempt`` 1e6, ``input_tokens`` 1e12, ``deadline_ts`` NaN and 1e20,
    ``ts`` 1e20, a 5 MB request with 270 000 block hashes) three times, each after 10 valid
    requests on the same key (partition); then 5 s of valid traffic: it must keep flowing."""
    await started(run)
    assert run.publisher is not None and run.collector is not None
    pills = poison_pills(run.rng)
    t0, index = time.time(), 0
    for _ in range(3):
        for raw in pills.values():
            for _ in range(10):
                run.publisher.request(run.valid("v", index))
                index += 1
                await asyncio.sleep(0.025)
            run.publisher.send(raw, MODEL.encode())
    await run.publisher.flush()
    run.fault_end = time.time()
    await run.steady("after", 5)
    run.window = (t0, time.time())
    await run.settle()
    collector, publisher = run.collector, run.publisher
    await run.until(lambda: len(collector.dead_letters) >= 3 * len(pills), 30)
    late = {k for k, ts in publisher.valid.items() if ts > (run.fault_end or 0)}
    run.extra["decided_after_last_pill"] = f"{collector.decided(late)}/{len(late)}"
    run.extra["pills"] = list(pills)
