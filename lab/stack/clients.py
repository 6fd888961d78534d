"""The clients of a lab stack: what publishes requests onto the broker and what collects the
output topics (decisions, admissions, completions, dead letters)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from infra.kafka.clients import partition_reader, start_client
from infra.kafka.connection import KafkaConnection
from schemas.codec import encode
from schemas.events import Event
from schemas.topics import TopicSpec, key_of


async def publish(
    bootstrap: str, spec: TopicSpec, events: Iterable[Event | tuple[bytes | None, bytes]]
) -> None:
    """Send events (JSON, keyed as ``spec`` says) or raw ``(key, value)`` pairs to ``spec``'s
    topic, in order, each acknowledged by the broker before the next is sent."""
    producer = await start_client(lambda: AIOKafkaProducer(bootstrap_servers=bootstrap), "publish")
    try:
        for event in events:
            key, value = event if isinstance(event, tuple) else (key_of(spec, event), encode(event))
            await producer.send_and_wait(spec.name, value, key=key)
    finally:
        await producer.stop()


class Publisher:
    """One producer for a run's records. ``send`` queues a record and returns at once (the
    caller's pace never waits on the broker); when the broker acknowledges it, ``on_ack`` gets
    the record's metadata (offset, CreateTime ``timestamp`` in ms); a record not handed over in
    ``send_timeout_s`` or not acknowledged in ``ack_timeout_s`` counts in ``failed``. ``flush``
    waits for what is in flight (bounded); ``stop`` flushes, then stops. ``config``: more
    ``AIOKafkaProducer`` settings."""

    def __init__(
        self,
        bootstrap: str,
        what: str = "publisher",
        *,
        send_timeout_s: float = 15.0,
        ack_timeout_s: float = 30.0,
        **config: Any,
    ) -> None:
        self.bootstrap, self.what, self.config = bootstrap, what, config
        self.send_timeout_s, self.ack_timeout_s = send_timeout_s, ack_timeout_s
        self.failed = 0
        self._pending: set[asyncio.Future[Any]] = set()
        self._producer: Any = None

    async def start(self) -> None:
        self._producer = await start_client(
            lambda: AIOKafkaProducer(bootstrap_servers=self.bootstrap, **self.config), self.what
        )

    def send(
        self, topic: str, value: bytes, key: bytes | None, on_ack: Callable[[Any], None] | None = None
    ) -> None:
        task: asyncio.Future[Any] = asyncio.ensure_future(self._send(topic, value, key, on_ack))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(
        self, topic: str, value: bytes, key: bytes | None, on_ack: Callable[[Any], None] | None
    ) -> None:
        try:
            delivery = await asyncio.wait_for(self._producer.send(topic, value, key=key), self.send_timeout_s)
            metadata = await asyncio.wait_for(delivery, self.ack_timeout_s)
        except Exception:
            self.failed += 1
            return
        if on_ack is not None:
            on_ack(metadata)

    async def flush(self, timeout_s: float = 40.0) -> None:
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)

    async def stop(self) -> None:
        await self.flush(20)
        for task in list(self._pending):
            task.cancel()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._producer.stop(), timeout=10)

    async def __aenter__(self) -> Publisher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


# ---------------------------------------------------------------- collecting


class Collector:
    """Reads ``topics`` in the background with a consumer of its own and hands each fetched
    batch to ``take(topic, records, now)`` (``now``: ``time.time()`` when it arrived). A subclass
    keeps what it needs; ``take`` runs in the event loop for every batch, so it is kept cheap.

    ``from_start=True``: every partition from offset 0, outside any consumer group (no join to
    wait for), as a subscription (it follows topics created after it started). ``False``: every
    partition from its end, the positions fixed before ``start`` returns, so everything published
    afterwards is seen and nothing before (the topics must exist). ``config``: more
    ``AIOKafkaConsumer`` settings.

    A failure of the reading loop ends it and is kept (``failure``, ``error``): ``check`` raises
    it, and leaving the ``async with`` block raises it unless something else is raised.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: Sequence[TopicSpec],
        *,
        from_start: bool = True,
        poll_ms: int = 200,
        max_records: int | None = None,
        what: str = "collector",
        **config: Any,
    ) -> None:
        self.bootstrap, self.topics, self.from_start = bootstrap, list(topics), from_start
        self.poll_ms, self.max_records, self.what, self.config = poll_ms, max_records, what, config
        self.failure: BaseException | None = None
        self._consumer: Any = None
        self._task: asyncio.Task[None] | None = None

    def take(self, topic: str, records: Sequence[Any], now: float) -> None:
        """Keep what is wanted of ``records`` (aiokafka ``ConsumerRecord``s) of ``topic``."""

    @property
    def error(self) -> str:
        """The reading loop's failure as one line; ``""`` while it reads."""
        return "" if self.failure is None else f"{self.what}: {type(self.failure).__name__}: {self.failure}"

    async def start(self) -> None:
        if self.from_start:
            self._consumer = await start_client(
                lambda: AIOKafkaConsumer(
                    *(spec.name for spec in self.topics),
                    bootstrap_servers=self.bootstrap,
                    group_id=None,  # no group: every partition assigned here, from the start
                    auto_offset_reset="earliest",
                    enable_auto_commit=False,
                    **self.config,
                ),
                self.what,
            )
        else:
            self._consumer = await partition_reader(
                KafkaConnection.plaintext(self.bootstrap), self.topics, "end", self.what, **self.config
            )
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                batch = await self._consumer.getmany(timeout_ms=self.poll_ms, max_records=self.max_records)
                now = time.time()
                for partition, records in batch.items():
                    self.take(partition.topic, records, now)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.failure = exc

    def check(self) -> None:
        """Raise the reading loop's failure, if it failed."""
        if self.failure is not None:
            raise self.failure

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), timeout=10)

    async def restart(self) -> None:
        """A new consumer, what was taken kept: after a broker restart the new log starts again
        at offset 0, and a consumer whose position the new log has already passed would skip
        its first records."""
        await self.stop()
        self.failure = None
        await self.start()

    async def __aenter__(self) -> Collector:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
        if exc is None:
            self.check()


class ValueCollector(Collector):
    """The values of ``spec``'s topic whose key is one of ``keys``, from the start, in order. On
    the topics keyed by affinity (``<pool>/<prefix or tenant>``), a pool's name as a key matches
    all of its pool's keys."""

    def __init__(self, bootstrap: str, spec: TopicSpec, *keys: bytes) -> None:
        super().__init__(bootstrap, [spec], poll_ms=100)
        self.keys = set(keys)
        self._pool_prefixes = tuple(key + b"/" for key in keys)
        self.values: list[bytes] = []

    def take(self, topic: str, records: Sequence[Any], now: float) -> None:
        self.values += [record.value for record in records if self._wanted(record.key)]

    def _wanted(self, key: bytes | None) -> bool:
        return key is not None and (key in self.keys or key.startswith(self._pool_prefixes))

    async def wait_for(
        self, count: int, timeout_s: float = 30.0, *, by: Callable[[bytes], Hashable] | None = None
    ) -> list[bytes]:
        """The values once there are ``count`` (or what there is after ``timeout_s``); with
        ``by``, ``count`` distinct ``by(value)`` (an event published again counts once)."""
        deadline = time.monotonic() + timeout_s

        def seen() -> int:
            return len(self.values) if by is None else len({by(value) for value in self.values})

        while seen() < count and time.monotonic() < deadline:
            self.check()
            await asyncio.sleep(0.1)
        return list(self.values)
