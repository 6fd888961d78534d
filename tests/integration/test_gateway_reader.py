"""The gateway's reader of ``tf.deciders`` leaves no Kafka client open behind it when it closes
(``make demo-vllm`` printed ``Unclosed AIOKafkaConsumer`` after each policy)."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

from gateway.deciders import Deciders
from infra.kafka.connection import KafkaConnection


def test_closing_the_deciders_reader_stops_its_consumer(broker: str) -> None:
    reported: list[str] = []

    async def open_then_close() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: reported.append(str(context.get("message"))))
        deciders = Deciders(KafkaConnection.plaintext(broker), "tokenfleet")
        await deciders.start()
        await asyncio.sleep(1.0)  # a few fetches
        assert deciders.running
        await deciders.close()
        gc.collect()  # an unclosed client says so when it is collected, inside its loop

    # What earlier tests in this process left unclosed is collected, and says so, before this
    # test listens: only this reader's clients count.
    gc.collect()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        asyncio.run(open_then_close())
        gc.collect()
    unclosed: list[Any] = [w.message for w in caught if "Unclosed AIOKafka" in str(w.message)]
    assert unclosed == [] and [m for m in reported if "Unclosed" in m] == []
