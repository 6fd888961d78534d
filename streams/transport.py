"""A Faust app whose Kafka consumer does not sit on fetches.

Faust hard-codes the consumer's ``fetch_max_wait_ms`` to 1500. A broker may hold a fetch that
long when less than ``fetch_min_bytes`` is waiting, and the embedded broker (Tansu) does: a
request then waits up to 1.5 s before the worker even sees it. The app takes the wait as a
plain argument (``Settings.consumer_fetch_max_wait_ms``, passed by ``create_app``) and builds its
transport with it (``fetch_wait_transport``).
"""

from __future__ import annotations

from typing import Any

import faust
from faust.transport.drivers import aiokafka as driver


def fetch_wait_transport(fetch_max_wait_ms: int) -> type[driver.Transport]:
    """Faust's aiokafka transport whose worker consumer waits at most ``fetch_max_wait_ms`` for
    a fetch's answer."""

    class WaitingConsumerThread(driver.AIOKafkaConsumerThread):
        def _create_worker_consumer(self, transport: Any) -> Any:
            consumer = super()._create_worker_consumer(transport)
            # Read by aiokafka when the consumer starts its fetcher.
            consumer._fetch_max_wait_ms = fetch_max_wait_ms
            return consumer

    class WaitingConsumer(driver.Consumer):
        def _new_consumer_thread(self) -> WaitingConsumerThread:
            return WaitingConsumerThread(self, loop=self.loop, beacon=self.beacon)

    class WaitingTransport(driver.Transport):
        Consumer = WaitingConsumer

    return WaitingTransport


class TokenFleetApp(faust.App):
    """``faust.App`` whose consumer waits at most ``fetch_max_wait_ms`` for a fetch's answer."""

    def __init__(self, *args: Any, fetch_max_wait_ms: int = 10, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._transport_type = fetch_wait_transport(fetch_max_wait_ms)

    def _new_transport(self) -> Any:
        return self._transport_type(self.conf.broker_consumer, self)
