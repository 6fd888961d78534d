"""Kafka client helpers shared by the fleet, the load generator and the benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from infra.errors import first_line
from infra.kafka.connection import KafkaConnection
from schemas.codec import encode
from schemas.events import Event
from schemas.topics import TopicSpec, key_of

log = logging.getLogger(__name__)


class _Client(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


ClientT = TypeVar("ClientT", bound=_Client)


async def start_client(factory: Callable[[], ClientT], what: str, timeout_s: float = 30.0) -> ClientT:
    """Build and start a Kafka client, retrying (fresh client each time) while the broker is
    still coming up; re-raises the last error after ``timeout_s``."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(KafkaError),
        stop=stop_after_delay(timeout_s),
        wait=wait_random_exponential(multiplier=0.2, max=2),
        reraise=True,
    ):
        with attempt:
            client = factory()
            try:
                await client.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await client.stop()
                raise
            if attempt.retry_state.attempt_number > 1:
                log.info("%s connected after %d attempts", what, attempt.retry_state.attempt_number)
            return client
    raise AssertionError("unreachable: AsyncRetrying re-raises")


async def send_event(producer: Any, spec: TopicSpec, event: Event) -> Awaitable[Any]:
    """Queue ``event`` on ``spec``'s topic (JSON, keyed); returns the delivery future."""
    future: Awaitable[Any] = await producer.send(spec.name, encode(event), key=key_of(spec, event))
    return future


class TopicsMissing(ValueError):
    """The broker does not have the topics a reader was asked for."""


async def partition_reader(
    connection: KafkaConnection,
    specs: Sequence[TopicSpec],
    at: Literal["beginning", "end"] | float,
    what: str,
    **config: Any,
) -> Any:
    """A started consumer outside any group, assigned every partition of ``specs``' topics and
    positioned at their beginning, their end, or (``at`` a number) the first record written
    ``at`` seconds ago or later (the beginning where the broker cannot look up by time) —
    resolved now, not at the first fetch, so nothing written after this returns can be missed.
    ``config``: more ``AIOKafkaConsumer`` settings. Raises ``TopicsMissing`` if none of the
    topics has a partition."""
    # A position the broker says is out of range (a recreated topic on a real Kafka) resumes at
    # the start of the new log, not at its end: what was written there since is not skipped.
    config = {"auto_offset_reset": "earliest", **config}
    consumer = await start_client(
        lambda: AIOKafkaConsumer(**connection.client_options(), enable_auto_commit=False, **config), what
    )
    try:
        await consumer.topics()  # fetch metadata, so the partitions are known
        partitions = [
            TopicPartition(spec.name, p)
            for spec in specs
            for p in sorted(consumer.partitions_for_topic(spec.name) or ())
        ]
        if not partitions:
            raise TopicsMissing(f"the topics {', '.join(s.name for s in specs)} do not exist on {connection}")
        consumer.assign(partitions)
        if at == "beginning":
            await consumer.seek_to_beginning(*partitions)
        elif at == "end":
            await consumer.seek_to_end(*partitions)
        else:
            await _seek_to_time(consumer, partitions, time.time() - float(at))
        for tp in partitions:
            await consumer.position(tp)
    except BaseException:
        await consumer.stop()  # a reader that is not returned is nobody's to stop
        raise
    return consumer


class LogWatch:
    """What a reader outside any group (``partition_reader``) learns from its fetches: whether
    the broker answers them, and which partitions' logs started again.

    A partition's log started again when the high watermark its last fetch reported is below
    the reader's position (offsets beyond the end: a restarted in-memory broker such as the
    embedded Tansu, a topic deleted and created again) or below a high watermark seen before
    (the new log is shorter than what was read of the old one). Such a broker answers a fetch
    beyond the end with no records and no error, so a reader that only fetches would wait, idle,
    until the new log reached its old position. ``check`` (after each ``getmany``) moves those
    partitions to the start of the new log, says so in one log line, and returns them; every
    record of the new log is read, those before the restart are not read again.

    ``fresh(max_age_s)``: the broker answered a fetch of this reader within ``max_age_s``."""

    def __init__(self, consumer: Any, what: str) -> None:
        self.consumer, self.what = consumer, what
        self.restarts = 0  # partitions found restarted, in all
        self._highest: dict[TopicPartition, int] = {}
        self._stamps: dict[TopicPartition, int] = {}
        self._answered: float | None = None  # monotonic: a fetch was last answered

    async def check(self) -> list[TopicPartition]:
        """The partitions whose log started again, now read from the new log's start."""
        restarted: list[TopicPartition] = []
        for tp in sorted(self.consumer.assignment()):
            stamp = self.consumer.last_poll_timestamp(tp)
            if stamp is not None and stamp != self._stamps.get(tp):
                self._stamps[tp] = stamp
                self._answered = time.monotonic()
            mark = self.consumer.highwater(tp)
            if mark is None:
                continue  # not fetched yet
            position = await self.consumer.position(tp)
            if position > mark or mark < self._highest.get(tp, 0):
                restarted.append(tp)
            self._highest[tp] = mark
        if restarted:
            self.restarts += len(restarted)
            names = ", ".join(f"{tp.topic}:{tp.partition}" for tp in restarted)
            log.warning(
                "%s: the log of %s started again (a restarted broker?); reading it from its start",
                self.what,
                names,
            )
            await self.consumer.seek_to_beginning(*restarted)
        return restarted

    def fresh(self, max_age_s: float) -> bool:
        return self._answered is not None and time.monotonic() - self._answered <= max_age_s


async def _seek_to_time(consumer: Any, partitions: list[TopicPartition], since: float) -> None:
    """Position each partition at its first record written at ``since`` (epoch s) or later."""
    ends = await consumer.end_offsets(partitions)
    try:
        starts = await consumer.offsets_for_times({tp: int(since * 1000) for tp in partitions})
    except Exception:  # the broker cannot look up by time: the whole partition
        await consumer.seek_to_beginning(*partitions)
        return
    for tp in partitions:
        found = starts.get(tp)
        consumer.seek(tp, ends[tp] if found is None else found.offset)


BROKER_ERRORS = (KafkaError, OSError)  # TimeoutError is an OSError


class BrokerUnavailable(ConnectionError):
    """The broker did not take what was sent within the retry budget (one line, for the CLI)."""


class ResilientProducer:
    """A producer for commands that publish and exit (the load generator, batch submit).

    ``send`` queues an event and keeps it until ``flush`` has it delivered. A failure (the
    broker away, a delivery not confirmed in ``send_timeout_s``) stops the producer and, with
    jittered back-off, recreates missing topics and a new producer and sends every undelivered
    event again (at least once), until ``budget_s`` has passed since the failure: then
    ``BrokerUnavailable``."""

    def __init__(
        self,
        connection: KafkaConnection,
        factory: Callable[[], Any],
        what: str,
        partitions: int,
        budget_s: float = 60.0,
        send_timeout_s: float = 15.0,
    ) -> None:
        self.connection, self.factory, self.what, self.partitions = connection, factory, what, partitions
        self.budget_s, self.send_timeout_s = budget_s, send_timeout_s
        self.producer: Any = None
        self.delivered = 0
        self._pending: list[tuple[TopicSpec, Event, Awaitable[Any] | None]] = []

    async def start(self) -> None:
        await self._retrying(self._connect, first=True)

    async def send(self, spec: TopicSpec, event: Event) -> None:
        self._pending.append((spec, event, None))
        try:
            future = await asyncio.wait_for(send_event(self.producer, spec, event), self.send_timeout_s)
        except BROKER_ERRORS as exc:
            log.warning("%s: sending failed (%s); retrying", self.what, first_line(exc))
            await self._retrying(self._resend)
            return
        self._pending[-1] = (spec, event, future)

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> None:
        """Every queued event delivered (or ``BrokerUnavailable``)."""
        try:
            await self._wait_delivered()
        except BROKER_ERRORS as exc:
            log.warning("%s: delivery failed (%s); retrying", self.what, first_line(exc))
            await self._retrying(self._resend)

    async def stop(self) -> None:
        producer, self.producer = self.producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 10.0)

    async def _wait_delivered(self) -> None:
        futures = [f for _, _, f in self._pending if f is not None]
        if len(futures) != len(self._pending):
            raise KafkaError("events not handed to the producer")
        if futures:
            await asyncio.wait_for(asyncio.gather(*futures), self.send_timeout_s)
        self.delivered += len(self._pending)
        self._pending.clear()

    async def _connect(self) -> None:
        await self.stop()
        from infra.kafka.broker import ensure_topics_async

        await ensure_topics_async(self.connection, self.partitions, timeout_s=min(10.0, self.budget_s))
        self.producer = await start_client(self.factory, self.what, timeout_s=min(10.0, self.budget_s))

    async def _resend(self) -> None:
        await self._connect()
        events = [(spec, event) for spec, event, _ in self._pending]
        self._pending = []
        for spec, event in events:
            self._pending.append((spec, event, await send_event(self.producer, spec, event)))
        await self._wait_delivered()

    async def _retrying(self, action: Callable[[], Awaitable[None]], first: bool = False) -> None:
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(BROKER_ERRORS),
                stop=stop_after_delay(self.budget_s),
                wait=wait_random_exponential(multiplier=0.5, max=5),
                reraise=True,
            ):
                with attempt:
                    await action()
        except BROKER_ERRORS as exc:
            await self.stop()
            state = "could not connect" if first else f"did not take {len(self._pending)} events"
            raise BrokerUnavailable(
                f"{self.what}: the Kafka broker at {self.connection} {state} within {self.budget_s:.0f} s "
                f"({self.delivered} delivered before): {first_line(exc)}"
            ) from exc
