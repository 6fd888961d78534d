"""The emulated fleet as a Kafka client: routing decisions in; completions, KV events, heartbeats out.

One asyncio loop around a ``sim.loop.live.LiveFleet``: wait for decisions or the fleet's next step
end / client give-up (whichever is first, never longer than to the next heartbeat), submit what
arrived, advance, send. Every message is JSON keyed by its topic's key (the model pool).
Invalid decisions are logged and skipped: the worker that wrote them owns the dead-letter topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from pydantic import ValidationError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from schemas.events import Completion, Event, Heartbeat, KvEvent, RoutingDecision
from schemas.topics import COMPLETIONS, DECISIONS, HEARTBEATS, KV_EVENTS, TopicSpec, key_of
from sim.engine.fleet import parse_fleet
from sim.loop.live import LiveFleet

log = logging.getLogger(__name__)

_MAX_POLL_RECORDS = 2000


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
    future: Awaitable[Any] = await producer.send(
        spec.name, event.model_dump_json().encode(), key=key_of(spec, event)
    )
    return future


@dataclass(frozen=True, slots=True)
class FleetCounts:
    decisions: int  # valid decisions executed
    duplicates: int  # redelivered decisions (same event id) skipped
    invalid: int  # messages skipped as undecodable
    completions: int
    kv_events: int
    heartbeats: int


async def run_fleet(
    bootstrap: str,
    fleet_spec: str,
    speed: float = 1.0,
    heartbeat_s: float = 0.25,
    stop: asyncio.Event | None = None,
    group_id: str = "tokenfleet-fleet",
    *,
    ready: asyncio.Event | None = None,
    auto_offset_reset: str = "earliest",
    session_timeout_s: float = 6.0,
    rebalance_timeout_s: float = 6.0,
    heartbeat_interval_s: float = 1.0,
) -> FleetCounts:
    """Emulate ``fleet_spec`` (see ``sim.engine.fleet.parse_fleet``) at ``speed`` until ``stop`` is set
    (or the task is cancelled). Stops within ``heartbeat_s`` of ``stop``; events produced up to
    then are delivered; attempts still running are abandoned (logged). ``ready`` is set once the
    consumer has its partitions: start sending load then, as TTFT counts from each request's
    ``ts`` and a consumer-group join (seconds) costs ``speed`` times that in emulated time.

    The consumer-group timeouts default low because Tansu holds a join for half the rebalance
    timeout. ``auto_offset_reset="earliest"``: a new group also executes decisions published
    while it was joining (a request already past its client timeout just times out).
    """
    if heartbeat_s <= 0:
        raise ValueError("heartbeat_s must be > 0")
    fleet = LiveFleet(parse_fleet(fleet_spec), speed, start_wall=time.time())
    if stop is None:
        stop = asyncio.Event()
    producer = await start_client(lambda: AIOKafkaProducer(bootstrap_servers=bootstrap), "fleet producer")
    try:
        consumer = await start_client(
            lambda: AIOKafkaConsumer(
                DECISIONS.name,
                bootstrap_servers=bootstrap,
                group_id=group_id,
                auto_offset_reset=auto_offset_reset,
                enable_auto_commit=True,
                session_timeout_ms=int(session_timeout_s * 1000),
                rebalance_timeout_ms=int(rebalance_timeout_s * 1000),
                heartbeat_interval_ms=int(heartbeat_interval_s * 1000),
            ),
            "fleet consumer",
        )
        try:
            loop = _FleetLoop(fleet, producer, consumer, heartbeat_s, ready)
            log.info("emulated fleet %s: %d instances, speed x%g", fleet_spec, len(fleet.instances), speed)
            await loop.run(stop)
            return loop.counts()
        finally:
            await consumer.stop()
    finally:
        await producer.stop()


class _FleetLoop:
    def __init__(
        self, fleet: LiveFleet, producer: Any, consumer: Any, heartbeat_s: float, ready: asyncio.Event | None
    ) -> None:
        self.fleet = fleet
        self.ready = ready
        self.producer = producer
        self.consumer = consumer
        self.heartbeat_s = heartbeat_s
        self.decisions = self.duplicates = self.invalid = 0
        self.completions = self.kv_events = self.heartbeats = 0

    async def run(self, stop: asyncio.Event) -> None:
        next_heartbeat = time.time()
        while not stop.is_set():
            now = time.time()
            wake = min(next_heartbeat, self.fleet.next_wakeup(now) or math.inf)
            batches = await self.consumer.getmany(
                timeout_ms=max(0, math.ceil((wake - now) * 1000)), max_records=_MAX_POLL_RECORDS
            )
            if self.ready is not None and not self.ready.is_set() and self.consumer.assignment():
                self.ready.set()
            now = time.time()
            for records in batches.values():
                for record in records:
                    self._submit(record.value, now)
            events: list[Completion | KvEvent | Heartbeat] = list(self.fleet.advance(now))
            if now >= next_heartbeat:
                events.extend(self.fleet.heartbeats(now))
                next_heartbeat += self.heartbeat_s
                if next_heartbeat <= now:  # after a stall, beat once rather than catching up
                    next_heartbeat = now + self.heartbeat_s
            await self._send(events)
        await self._send(list(self.fleet.advance(time.time())))
        if self.fleet.open_attempts:
            log.info("fleet stopping with %d attempts still running", self.fleet.open_attempts)

    def _submit(self, value: bytes | None, now: float) -> None:
        try:
            decision = RoutingDecision.model_validate_json(value or b"")
        except ValidationError as exc:
            self.invalid += 1
            log.warning("skipping an invalid routing decision (%d errors): %s", exc.error_count(), exc)
            return
        if self.fleet.submit(decision, now):
            self.decisions += 1
        else:
            self.duplicates += 1

    async def _send(self, events: list[Completion | KvEvent | Heartbeat]) -> None:
        futures = []
        for event in events:
            if isinstance(event, Completion):
                spec, self.completions = COMPLETIONS, self.completions + 1
            elif isinstance(event, KvEvent):
                spec, self.kv_events = KV_EVENTS, self.kv_events + 1
            else:
                spec, self.heartbeats = HEARTBEATS, self.heartbeats + 1
            futures.append(await send_event(self.producer, spec, event))
        if futures:
            await asyncio.gather(*futures)

    def counts(self) -> FleetCounts:
        return FleetCounts(
            self.decisions, self.duplicates, self.invalid, self.completions, self.kv_events, self.heartbeats
        )
