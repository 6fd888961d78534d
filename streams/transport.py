"""A Faust app whose Kafka consumer does not sit on fetches.

Faust hard-codes the consumer's ``fetch_max_wait_ms`` to 1500. A broker may hold a fetch that
long when less than ``fetch_min_bytes`` is waiting, and the embedded broker (Tansu) does: a
request then waits up to 1.5 s before the worker even sees it (measured: p99 0.9-1.5 s of
end-to-end decision latency). We set it from ``Settings.consumer_fetch_max_wait_ms``.
"""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as driver


class _ConsumerThread(driver.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Read by aiokafka when the consumer starts its fetcher.
        consumer._fetch_max_wait_ms = self.app.conf.tokenfleet_fetch_max_wait_ms
        return consumer


class _Consumer(driver.Consumer):
    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(driver.Transport):
    Consumer = _Consumer


class TokenFleetApp(faust.App):
    """``faust.App`` with the consumer fetch wait taken from settings."""

    def __init__(self, *args: Any, fetch_max_wait_ms: int = 10, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conf.tokenfleet_fetch_max_wait_ms = fetch_max_wait_ms

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)
