"""The gateway's view of the scheduler's answers: ``tf.admission`` and ``tf.decisions``, read for
the requests this gateway published.

One consumer outside any group, assigned every partition of both topics and positioned at their
ends before the first request is published (so no answer can be missed). ``expect(key)`` before
publishing, then await the future: it resolves with the ``RoutingDecision`` (admitted and
placed) or the rejecting ``AdmissionDecision``; a ``queue`` answer keeps it waiting. Answers for
other gateways' requests are skipped after a cheap look at their request id. If the broker
connection breaks, the consumer is rebuilt (positioned at the ends again: a request whose answer
was lost meanwhile times out at the caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from infra.kafka.clients import TopicsMissing, partition_reader
from infra.kafka.connection import KafkaConnection
from schemas.codec import DecodeError, decode
from schemas.events import AdmissionDecision, RoutingDecision
from schemas.topics import ADMISSION, DECISIONS

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (request id, attempt)
Answer = RoutingDecision | AdmissionDecision


class DecisionWaiter:
    def __init__(self, connection: KafkaConnection, fetch_max_wait_ms: int = 5) -> None:
        self.connection = connection
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self._pending: dict[Key, asyncio.Future[Answer]] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def start(self) -> None:
        """Connect and position at the ends of both topics; returns once positioned."""
        self._consumer = await self._positioned_consumer()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._consumer.stop(), 2.0)
        for future in self._pending.values():
            future.cancel()

    def expect(self, key: Key) -> asyncio.Future[Answer]:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        return future

    def forget(self, key: Key) -> None:
        self._pending.pop(key, None)

    async def _positioned_consumer(self) -> AIOKafkaConsumer:
        consumer: AIOKafkaConsumer = await partition_reader(
            self.connection,
            (ADMISSION, DECISIONS),
            "end",
            "gateway decision consumer",
            auto_offset_reset="latest",
            # A decision is awaited by a client: fetch at once. Brokers that hold a fetch for its
            # whole wait (Tansu) would otherwise add up to aiokafka's 500 ms.
            fetch_max_wait_ms=self.fetch_max_wait_ms,
        )
        return consumer

    async def _run(self) -> None:
        while True:
            consumer = self._consumer
            assert consumer is not None
            try:
                batches = await consumer.getmany(timeout_ms=200, max_records=1000)
            except KafkaError as exc:
                log.warning("gateway: reading decisions failed (%s); reconnecting", exc)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(consumer.stop(), 2.0)
                await asyncio.sleep(0.5)
                with contextlib.suppress(KafkaError, OSError, TopicsMissing):
                    self._consumer = await self._positioned_consumer()
                continue
            for tp, records in batches.items():
                for record in records:
                    self._offer(tp.topic, record.value)

    def _offer(self, topic: str, value: bytes | None) -> None:
        if not self._pending or value is None:
            return
        key = _key(value)
        future = self._pending.get(key) if key is not None else None
        if future is None or future.done():
            return
        try:
            if topic == DECISIONS.name:
                answer: Answer = decode(RoutingDecision, value)
            else:
                answer = decode(AdmissionDecision, value)
                if answer.action != "reject":
                    return  # admitted: the routing decision follows; queued: still waiting
        except DecodeError:
            return
        del self._pending[key]  # type: ignore[arg-type]
        future.set_result(answer)


def _key(value: bytes) -> Key | None:
    try:
        fields: Any = json.loads(value)
        return str(fields["request_id"]), int(fields.get("attempt", 1))
    except (ValueError, KeyError, TypeError):
        return None
