"""The Faust app's consumer waits on a fetch as long as its argument says, not Faust's 1.5 s."""

from __future__ import annotations

import asyncio

from streams.transport import TokenFleetApp


def test_the_worker_consumer_takes_the_fetch_wait_it_was_built_with() -> None:
    async def built(wait_ms: int) -> int:
        app = TokenFleetApp("t", broker="kafka://127.0.0.1:1", fetch_max_wait_ms=wait_ms)
        thread = app.consumer._new_consumer_thread()  # type: ignore[attr-defined]
        consumer = thread._create_worker_consumer(app.transport)  # never started: no broker needed
        try:
            return int(consumer._fetch_max_wait_ms)
        finally:
            await consumer.stop()

    assert asyncio.run(built(7)) == 7
    assert asyncio.run(built(250)) == 250  # one app's wait is not another's
