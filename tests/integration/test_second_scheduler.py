"""One scheduler per set of topics: a worker of another app id refuses to start, in one line
naming the scheduler already deciding (found on the log: the embedded broker lists no groups)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from schemas.topics import ADMISSION, REQUESTS
from tests.integration.streaming import Collector, publish, request, unique, worker


def test_a_second_scheduler_on_the_same_topics_refuses_to_start(broker: str, tmp_path: Path) -> None:
    pool, first_app = unique("refuse"), unique("first")
    first = worker(broker, first_app, tmp_path / "first")
    try:
        first.wait_ready(90)

        async def decided() -> None:  # its decisions carry its deciders' group
            answers = Collector(broker, ADMISSION, pool.encode())
            await answers.start()
            await publish(broker, REQUESTS, [request(pool, unique("r"))])
            assert await answers.wait_for(1, 30)
            await answers.stop()

        asyncio.run(decided())
        second = worker(
            broker,
            unique("second"),
            tmp_path / "second",
            settings={"TOKENFLEET_REFUSE_OTHER_SCHEDULERS": "true"},
        )
        deadline = time.monotonic() + 60
        while second.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert second.process.poll() == 2, second.log()[-2000:]
        lines = [line for line in second.log().splitlines() if "another scheduler" in line]
        assert len(lines) == 1 and f"{first_app}-deciders" in lines[0]
        assert "Traceback" not in second.log()
    finally:
        first.stop()

    # Once the first has stopped deciding, a scheduler of another app id starts. (The embedded
    # broker keeps a departed member in its group for a while: the log's last 15 s decide.)
    time.sleep(16)
    third = worker(
        broker, unique("third"), tmp_path / "third", settings={"TOKENFLEET_REFUSE_OTHER_SCHEDULERS": "true"}
    )
    try:
        third.wait_ready(90)
    finally:
        third.stop()
