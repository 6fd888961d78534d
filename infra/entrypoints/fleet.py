"""The dispatcher: routing decisions in; first tokens, completions, KV events, heartbeats out.

One asyncio loop around an engine port (``infra.engines.port.EnginePort``): wait for decisions
or the engines' next wakeup (whichever is first, never longer than to the next heartbeat),
dispatch what arrived, collect the engines' events, send. Every message is JSON keyed by its
topic's key (the model pool). Invalid decisions are logged and skipped: the worker that wrote
them owns the dead-letter topic. ``tokenfleet fleet`` runs it over the emulated engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from infra.engines.emulated import EmulatedEngines
from infra.engines.port import EngineEvent, EnginePort
from infra.kafka.clients import send_event, start_client
from schemas.codec import DecodeError, decode
from schemas.events import Completion, Event, Heartbeat, KvEvent, ResponseStarted, RoutingDecision
from schemas.topics import COMPLETIONS, DECISIONS, FIRST_TOKENS, HEARTBEATS, KV_EVENTS, TopicSpec

log = logging.getLogger(__name__)

_MAX_POLL_RECORDS = 2000
_TOPIC_OF: dict[type[Event], TopicSpec] = {
    ResponseStarted: FIRST_TOKENS,
    Completion: COMPLETIONS,
    KvEvent: KV_EVENTS,
    Heartbeat: HEARTBEATS,
}


@dataclass(frozen=True, slots=True)
class FleetCounts:
    decisions: int  # valid decisions executed
    duplicates: int  # redelivered decisions (same event id) skipped
    invalid: int  # messages skipped as undecodable
    first_tokens: int
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
    """Emulate ``fleet_spec`` (``EmulatedEngines.from_spec``) at ``speed`` until ``stop`` is set
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
    engines = EmulatedEngines.from_spec(fleet_spec, speed, start_wall=time.time())
    if stop is None:
        stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(engines.close)
        producer = await start_client(lambda: AIOKafkaProducer(bootstrap_servers=bootstrap), "fleet producer")
        stack.push_async_callback(producer.stop)
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
        stack.push_async_callback(consumer.stop)
        loop = _FleetLoop(engines, producer, consumer, heartbeat_s, ready)
        log.info("emulated fleet %s: %d endpoints, speed x%g", fleet_spec, len(engines.endpoints), speed)
        await loop.run(stop)
    return loop.counts()


class _FleetLoop:
    """Decisions from ``consumer`` into ``engines``; what the engines report onto ``producer``."""

    def __init__(
        self,
        engines: EnginePort,
        producer: Any,
        consumer: Any,
        heartbeat_s: float,
        ready: asyncio.Event | None,
    ) -> None:
        self.engines = engines
        self.ready = ready
        self.producer = producer
        self.consumer = consumer
        self.heartbeat_s = heartbeat_s
        self.decisions = self.duplicates = self.invalid = 0
        self.sent: Counter[TopicSpec] = Counter()

    async def run(self, stop: asyncio.Event) -> None:
        next_heartbeat = time.time()
        while not stop.is_set():
            now = time.time()
            wake = next_heartbeat
            engine_wake = self.engines.next_wakeup(now)
            if engine_wake is not None:
                wake = min(wake, engine_wake)
            batches = await self.consumer.getmany(
                timeout_ms=max(0, math.ceil((wake - now) * 1000)), max_records=_MAX_POLL_RECORDS
            )
            if self.ready is not None and not self.ready.is_set() and self.consumer.assignment():
                self.ready.set()
            # One instant for the whole batch: decisions polled together reach the engines together.
            now = time.time()
            for records in batches.values():
                for record in records:
                    await self._dispatch(record.value, now)
            events: list[EngineEvent | Heartbeat] = list(await self.engines.events(now))
            if now >= next_heartbeat:
                events.extend(await self.engines.load(now))
                next_heartbeat += self.heartbeat_s
                if next_heartbeat <= now:  # after a stall, beat once rather than catching up
                    next_heartbeat = now + self.heartbeat_s
            await self._send(events)
        await self._send(list(await self.engines.events(time.time())))
        if self.engines.open_requests:
            log.info("fleet stopping with %d attempts still running", self.engines.open_requests)

    async def _dispatch(self, value: bytes | None, now: float) -> None:
        try:
            decision = decode(RoutingDecision, value)
        except DecodeError as exc:
            self.invalid += 1
            log.warning("skipping an invalid routing decision: %s", exc.reason)
            return
        if await self.engines.dispatch(decision, now):
            self.decisions += 1
        else:
            self.duplicates += 1

    async def _send(self, events: list[EngineEvent | Heartbeat]) -> None:
        futures = []
        for event in events:
            spec = _TOPIC_OF[type(event)]
            self.sent[spec] += 1
            futures.append(await send_event(self.producer, spec, event))
        if futures:
            await asyncio.gather(*futures)

    def counts(self) -> FleetCounts:
        return FleetCounts(
            decisions=self.decisions,
            duplicates=self.duplicates,
            invalid=self.invalid,
            first_tokens=self.sent[FIRST_TOKENS],
            completions=self.sent[COMPLETIONS],
            kv_events=self.sent[KV_EVENTS],
            heartbeats=self.sent[HEARTBEATS],
        )
