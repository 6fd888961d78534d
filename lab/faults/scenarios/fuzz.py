"""``fuzz``: bad input in bulk; every bad message must be dead-lettered and no valid one lost."""

from __future__ import annotations

import asyncio
import time

from lab.faults import MODEL
from lab.faults.harness import Run, started
from lab.faults.messages import fuzzed_messages


async def fuzz(run: Run) -> None:
    """10 000 fuzzed messages (seeded mutations of valid requests: random bytes, truncated JSON,
    wrong types, huge numbers, NaN and infinities, extra and missing fields, non-objects, bad
    UTF-8; each checked not to decode) shuffled among 500 valid requests, ~1 000 msg/s, mostly
    on the pool's key (one partition), some on random keys or none."""
    await started(run)
    assert run.publisher is not None and run.collector is not None
    bad = fuzzed_messages(10_000, seed=1)
    items: list[bytes | None] = [*bad, *([None] * 500)]  # None: a valid request goes there
    run.rng.shuffle(items)
    start, sent, valid_index = time.monotonic(), 0, 0
    t0 = time.time()
    while sent < len(items):
        due = min(len(items), int((time.monotonic() - start) * 1000) + 1)
        for item in items[sent:due]:
            if item is None:
                run.publisher.request(run.valid("v", valid_index))
                valid_index += 1
            else:
                roll = run.rng.random()
                key = MODEL.encode() if roll < 0.9 else None if roll < 0.95 else run.rng.randbytes(8)
                run.publisher.send(item, key)
        sent = due
        await asyncio.sleep(0.01)
    await run.publisher.flush()
    run.window = (t0, time.time())
    run.fault_end = time.time()
    await run.steady("after", 3)
    await run.settle()
    collector = run.collector
    await run.until(
        lambda: len(collector.dead_letters) >= len(bad), 60, 15, lambda: len(collector.dead_letters)
    )
