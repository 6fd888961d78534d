"""``baseline``: no fault. Its p99 is the reference for the other scenarios."""

from __future__ import annotations

import time

from lab.faults.harness import Run, started


async def baseline(run: Run) -> None:
    """No fault: steady valid traffic for 20 s. Its p99 is the reference for the others."""
    await started(run)
    start = time.time()
    await run.steady("s", 20)
    run.window = (start, time.time())
    await run.settle()
