"""The dispatcher: routing decisions in; first tokens, completions, responses, KV events, heartbeats out.

One asyncio loop around an engine port (``dispatcher.engines.port.EnginePort``): wait for decisions
or the engines' next wakeup (whichever is first, never longer than to the next heartbeat),
dispatch what arrived, collect the engines' events, send. Every message is JSON keyed by its
topic's key (the model pool; a response's, its request id). Invalid decisions are logged and
skipped: the worker that wrote them owns the dead-letter topic. ``tokenfleet fleet`` runs it
over the emulated engines, or over real vLLM servers (``--engine vllm``). Decisions about
requests a gateway accepted (``reply="http"``) are that gateway's to execute: not run here, but
counted in their instance's ``tokens_in_flight`` until their completion (``dispatcher/elsewhere.py``).

Nothing it held is lost with it, and a request runs once (``dispatcher/ledger.py``): a decision's
offset is committed only once its attempt's end reached the broker, so a dispatcher that
replaces a killed one runs again only the attempts that were open at the kill; the answers
given are kept (and read back from ``tf.responses`` at start), and a decision about an attempt
already answered gets that answer again instead of a second run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from dispatcher.elsewhere import RunElsewhere
from dispatcher.engines.emulated import EmulatedEngines
from dispatcher.engines.port import EngineEvent, EnginePort
from dispatcher.ledger import Ledger
from infra.errors import first_line
from infra.kafka.broker import ensure_topics_async
from infra.kafka.clients import LogWatch, partition_reader, send_event, start_client
from infra.kafka.connection import KafkaConnection
from schemas.codec import DecodeError, decode
from schemas.events import Completion, Event, Heartbeat, KvEvent, Response, ResponseStarted, RoutingDecision
from schemas.topics import COMPLETIONS, DECISIONS, FIRST_TOKENS, HEARTBEATS, KV_EVENTS, RESPONSES, TopicSpec
from streams.clients import stop_client

log = logging.getLogger(__name__)

_MAX_POLL_RECORDS = 2000
_TOPIC_OF: dict[type[Event], TopicSpec] = {
    ResponseStarted: FIRST_TOKENS,
    Completion: COMPLETIONS,
    Response: RESPONSES,
    KvEvent: KV_EVENTS,
    Heartbeat: HEARTBEATS,
}


@dataclass(frozen=True, slots=True)
class FleetCounts:
    decisions: int  # valid decisions executed
    duplicates: int  # redelivered decisions (same event id) skipped
    gateway_requests: int  # decisions about requests a gateway executes itself (reply="http")
    invalid: int  # messages skipped as undecodable
    first_tokens: int  # ResponseStarted published, prefill legs' ends included
    completions: int
    responses: int
    kv_events: int
    heartbeats: int
    reconnects: int = 0  # times the broker was lost and the clients started again
    answered_again: int = 0  # decisions about attempts already answered: the answer sent again


@dataclass(frozen=True, slots=True)
class Reconnect:
    """When the dispatcher takes the broker for lost, and how it comes back (seconds)."""

    send_timeout_s: float = 5.0  # events not delivered in this time
    fetch_stale_s: float = 5.0  # assigned, but no fetch answered
    unassigned_s: float = 30.0  # no partitions since connecting (or since the last assignment)
    probe_s: float = 0.5  # how often it looks at the consumer
    backoff_initial_s: float = 0.25
    backoff_max_s: float = 5.0
    topics_timeout_s: float = 10.0  # retry budget of one ensure_topics
    # Stopping the clients of a lost connection: a consumer leaving a group the broker forgot,
    # or a producer flushing into a dead connection, would otherwise hold the reconnect for
    # seconds. Nothing is lost by abandoning them: undelivered events stay in the backlog and
    # decisions are committed only once dispatched.
    stop_timeout_s: float = 1.0


class BrokerLost(KafkaError):  # type: ignore[misc]
    """The dispatcher's clients no longer work with the broker (it reconnects)."""


_BROKER_ERRORS = (KafkaError, OSError)  # TimeoutError is an OSError
_MAX_BACKLOG = 200_000  # engine events kept for resending while the broker is away
# How far back the completions are sent again when the broker lost its log: longer than the
# store's consumer can lag behind the log on a busy machine (seconds, not minutes).
_ENDS_RESENT_S = 60.0
_SEND_FAILURES_BEFORE_RECONNECT = 3  # sends refused in a row (not timed out) before reconnecting


async def run_fleet(
    connection: KafkaConnection,
    fleet_spec: str | EnginePort,
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
    partitions: int | None = None,
    reconnect: Reconnect | None = None,
    output_tokens: Mapping[str, int] | None = None,
) -> FleetCounts:
    """Drive ``fleet_spec`` — an engine port (real engines), or a fleet spec to emulate
    (``EmulatedEngines.from_spec``) at ``speed`` — until ``stop`` is set (or the task is
    cancelled); the engines are closed at the end. ``output_tokens``: the emulated answers'
    lengths by request id (the workload's; others generate their whole budget). Stops within
    ``heartbeat_s`` of ``stop``; events produced up to then are delivered; attempts still
    running are abandoned (logged).
    ``ready`` is set once the consumer has its partitions (and cleared while the broker is
    lost: the dispatcher's ``/ready``): start sending load then, as TTFT
    counts from each request's ``ts`` and a consumer-group join (seconds) costs ``speed`` times
    that in emulated time.

    The consumer-group timeouts default low because Tansu holds a join for half the rebalance
    timeout. ``auto_offset_reset="earliest"``: a new group also executes decisions published
    while it was joining (a request already past its client timeout just times out).

    Broker outages (``reconnect``): when deliveries time out or keep failing, fetches go
    unanswered, or no partition is assigned for long, the clients are stopped and, after a
    jittered back-off, missing topics are recreated (``partitions`` each, default the
    settings') and new clients started; the engines keep their state and the events not
    delivered are sent again (at least once). It keeps trying until ``stop``. A partition whose
    high watermark goes down (the broker lost its log: a restarted embedded Tansu, which the
    clients already reconnected to) makes every partition be read again from its start, without
    a reconnect.
    """
    if heartbeat_s <= 0:
        raise ValueError("heartbeat_s must be > 0")
    reconnect = reconnect or Reconnect()
    if partitions is None:
        from infra.settings import Settings

        partitions = Settings().topic_partitions
    if isinstance(fleet_spec, str):
        engines: EnginePort = EmulatedEngines.from_spec(
            fleet_spec, speed, start_wall=time.time(), output_tokens=output_tokens
        )
        log.info("emulated fleet %s: %d endpoints, speed x%g", fleet_spec, len(engines.endpoints), speed)
    else:
        engines = fleet_spec
        log.info("dispatching to %d engines", len(engines.endpoints))
    if stop is None:
        stop = asyncio.Event()
    loop = _FleetLoop(engines, heartbeat_s, ready, reconnect)
    try:
        failures = 0
        lost_at = topics_s = 0.0
        while True:
            try:
                async with contextlib.AsyncExitStack() as stack:
                    connecting = time.monotonic()
                    producer = await start_client(
                        lambda: AIOKafkaProducer(**connection.client_options(), request_timeout_ms=10_000),
                        "fleet producer",
                    )
                    stack.push_async_callback(stop_client, producer, reconnect.stop_timeout_s)
                    consumer = await start_client(
                        lambda: AIOKafkaConsumer(
                            DECISIONS.name,
                            **connection.client_options(),
                            group_id=group_id,
                            auto_offset_reset=auto_offset_reset,
                            # Committed by the loop after each dispatched batch, never on stop:
                            # a consumer stopped after the broker lost its log would commit its
                            # old positions into the new log and skip what was written there.
                            enable_auto_commit=False,
                            session_timeout_ms=int(session_timeout_s * 1000),
                            rebalance_timeout_ms=int(rebalance_timeout_s * 1000),
                            heartbeat_interval_ms=int(heartbeat_interval_s * 1000),
                        ),
                        "fleet consumer",
                    )
                    stack.push_async_callback(stop_client, consumer, reconnect.stop_timeout_s)
                    if failures:
                        log.warning(
                            "fleet: reconnected to %s %.1f s after losing it (topics %.1f s, clients %.1f s)",
                            connection, time.monotonic() - lost_at, topics_s, time.monotonic() - connecting,
                        )  # fmt: skip
                        failures = 0
                    if not loop.recalled:
                        recalled = await loop.ledger.recall(connection)
                        loop.recalled = True
                        log.info("fleet: %d answers of the last minutes read back from the log", recalled)
                    ends = None
                    if not isinstance(engines, EmulatedEngines):  # (no gateway runs on emulated ones)
                        # From as far back as a decision still counts (``RunElsewhere``): the
                        # end of a call decided before this reader started is read too.
                        since = loop.elsewhere.forget_after_s
                        ends = await partition_reader(connection, [COMPLETIONS], since, "fleet ends reader")
                        stack.push_async_callback(stop_client, ends, reconnect.stop_timeout_s)
                    await loop.run(stop, producer, consumer, ends)
                return loop.counts()
            except _BROKER_ERRORS as exc:
                if stop.is_set():
                    return loop.counts()
                if ready is not None:
                    ready.clear()  # not serving until the new consumer has its partitions again
                if not failures:
                    lost_at = time.monotonic()
                failures += 1
                loop.reconnects += 1
                ceiling = min(reconnect.backoff_max_s, reconnect.backoff_initial_s * 2.0 ** (failures - 1))
                delay = ceiling * random.uniform(0.5, 1.0)
                log.warning(
                    "fleet: lost the broker (%s); reconnecting in %.2f s",
                    first_line(exc), delay, exc_info=not isinstance(exc, BrokerLost),
                )  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    return loop.counts()
                started = time.monotonic()
                with contextlib.suppress(*_BROKER_ERRORS):  # not yet: the next connect fails and waits
                    await ensure_topics_async(connection, partitions, timeout_s=reconnect.topics_timeout_s)
                topics_s = time.monotonic() - started
    finally:
        await engines.close()


class _FleetLoop:
    """Decisions from ``consumer`` into ``engines``; what the engines report onto ``producer``."""

    def __init__(
        self,
        engines: EnginePort,
        heartbeat_s: float,
        ready: asyncio.Event | None,
        reconnect: Reconnect,
    ) -> None:
        self.engines = engines
        self.ready = ready
        self.heartbeat_s = heartbeat_s
        self.reconnect_limits = reconnect
        self.producer: Any = None
        self.consumer: Any = None
        self.decisions = self.duplicates = self.invalid = self.reconnects = self.gateway_requests = 0
        self.answered_again = 0
        self.sent: Counter[TopicSpec] = Counter()
        self.ledger = Ledger()  # what ran, and what it answered (dispatcher/ledger.py)
        self.elsewhere = RunElsewhere()  # what gateways run on these engines (dispatcher/elsewhere.py)
        self.recalled = False  # the ledger read back the answers already on the log
        self.ends_watch: LogWatch | None = None  # the completions reader's restarts
        self._again: list[EngineEvent] = []  # answers to send again (decisions already answered)
        self._backlog: list[EngineEvent | Heartbeat] = []  # not delivered before an outage
        self._failed_sends = 0  # in a row

    async def run(self, stop: asyncio.Event, producer: Any, consumer: Any, ends: Any = None) -> None:
        """Until ``stop``: decisions from ``consumer``, events onto ``producer``; ``ends``: a
        reader of ``tf.completions``, for the gateway-run requests' ends (None: no gateway)."""
        self.producer, self.consumer = producer, consumer
        self.ends_watch = None if ends is None else LogWatch(ends, "fleet's reader of the completions")
        liveness = _Liveness(consumer, self.reconnect_limits)
        next_heartbeat = time.time()
        if self.reconnects:
            self.ledger.reconnected()
            await self._ends_again_if_lost()  # (before the backlog: it would move the ends)
        await self._send([])  # the backlog of the previous connection first
        while not stop.is_set():
            now = time.time()
            wake = next_heartbeat
            engine_wake = self.engines.next_wakeup(now)
            if engine_wake is not None:
                wake = min(wake, engine_wake)
            batches = await self.consumer.getmany(
                timeout_ms=max(0, math.ceil((wake - now) * 1000)), max_records=_MAX_POLL_RECORDS
            )
            assigned = bool(self.consumer.assignment())
            if self.ready is not None and not self.ready.is_set() and assigned:
                self.ready.set()
            lost = liveness.check()
            if lost:
                # The broker lost its log (a restarted embedded Tansu): our positions point into a
                # log that is gone. Read the new log from its start rather than reconnect (a new
                # consumer's group join costs seconds); the engines run each attempt once. Every
                # partition, not only those whose high watermark went down: the broker lost all of
                # them at once, and a partition the new log had already grown past our old
                # position on would otherwise skip the decisions written there since the restart.
                partitions = list(self.consumer.assignment())
                log.warning(
                    "fleet: the broker lost its log (%s); reading %d partitions again from the start",
                    lost,
                    len(partitions),
                )
                await self.consumer.seek_to_beginning(*partitions)
                self.ledger.log_lost(partitions)
                self._ends_again()
            # One instant for the whole batch: decisions polled together reach the engines together.
            now = time.time()
            for tp, records in batches.items():
                for record in records:
                    await self._dispatch(record.value, now, tp, record.offset)
                if records:
                    self.ledger.read(tp, records[-1].offset + 1)
            # Only past decisions whose end the broker has (dispatcher/ledger.py).
            due = self.ledger.to_commit(self.consumer.assignment())
            if due:
                await self.consumer.commit(due)
            events: list[EngineEvent | Heartbeat] = [*self._again, *await self.engines.events(now)]
            self._again = []
            if now >= next_heartbeat:
                if ends is not None:
                    await self._read_ends(ends)
                events.extend(self.elsewhere.add_to(await self.engines.load(now), now))
                next_heartbeat += self.heartbeat_s
                if next_heartbeat <= now:  # after a stall, beat once rather than catching up
                    next_heartbeat = now + self.heartbeat_s
            await self._send(events)
        await self._send(list(await self.engines.events(time.time())))
        if self.engines.open_requests:
            log.info("fleet stopping with %d attempts still running", self.engines.open_requests)

    async def _ends_again_if_lost(self) -> None:
        """After a reconnect: if the broker lost the completions it had acknowledged (a
        restarted in-memory broker), send the recent ones again."""
        partitions = await self.producer.partitions_for(COMPLETIONS.name)
        tps = [TopicPartition(COMPLETIONS.name, p) for p in sorted(partitions or ())]
        ends = await self.consumer.end_offsets(tps) if tps else {}
        if self.ledger.log_restarted({tp.partition: offset for tp, offset in ends.items()}):
            self._ends_again()

    def _ends_again(self) -> None:
        """Send the completions of the last ``_ENDS_RESENT_S`` again: the broker lost its log,
        and with it those its consumers (the store's) had not read yet (``dispatcher/ledger.py``)."""
        again = self.ledger.recent_ends(time.time() - _ENDS_RESENT_S)
        log.warning("fleet: the broker lost its log; sending the last %d completions again", len(again))
        self._again.extend(again)

    async def _dispatch(self, value: bytes | None, now: float, partition: Any, offset: int) -> None:
        try:
            decision = decode(RoutingDecision, value)
        except DecodeError as exc:
            self.invalid += 1
            log.warning("skipping an invalid routing decision: %s", exc.reason)
            return
        if decision.request.reply != "kafka":
            self.gateway_requests += 1  # the gateway that accepted it runs it and answers
            self.elsewhere.started(decision, now)  # (its tokens count in its instance's load)
            return
        answer = self.ledger.answer(decision.request_id, decision.attempt)
        if answer is not None:  # ran and answered before: the same answer again, never a second run
            self._again.append(answer)
            self.answered_again += 1
        elif await self.engines.dispatch(decision, now):
            self.decisions += 1
            self.ledger.started(decision.request_id, decision.attempt, partition, offset)
        else:
            self.duplicates += 1

    async def _read_ends(self, ends: Any) -> None:
        """The completions published since the last look (without waiting): gateway-run
        requests that ended leave their instance's load."""
        for records in (await ends.getmany(timeout_ms=0, max_records=_MAX_POLL_RECORDS)).values():
            for record in records:
                with contextlib.suppress(DecodeError):
                    self.elsewhere.ended(decode(Completion, record.value))
        if self.ends_watch is not None:
            await self.ends_watch.check()  # a restarted broker's completions are read from its start

    async def _send(self, events: list[EngineEvent | Heartbeat]) -> None:
        """Send and wait for delivery (``BrokerLost`` after ``send_timeout_s``). What was not
        delivered stays in the backlog for the next connection, but heartbeats: the next beat
        says it better."""
        if self._backlog:
            events, self._backlog = [*self._backlog, *events], []
        if not events:
            return
        try:
            futures = [await send_event(self.producer, _TOPIC_OF[type(event)], event) for event in events]
            acks = await asyncio.wait_for(asyncio.gather(*futures), self.reconnect_limits.send_timeout_s)
        except BaseException as exc:
            kept: list[EngineEvent | Heartbeat] = [e for e in events if not isinstance(e, Heartbeat)]
            self._backlog = kept[-_MAX_BACKLOG:]
            if isinstance(exc, TimeoutError):
                raise BrokerLost(
                    f"events not delivered in {self.reconnect_limits.send_timeout_s:.0f} s"
                ) from exc
            self._failed_sends += 1
            if isinstance(exc, KafkaError) and self._failed_sends < _SEND_FAILURES_BEFORE_RECONNECT:
                # One refused write (Tansu answers UnknownError to a produce that raced another
                # right after its restart) is not a lost broker: send the backlog next round.
                log.info("fleet: a send failed (%s); sending again", first_line(exc))
                return
            raise
        self._failed_sends = 0
        self.ledger.delivered(events)
        for event, ack in zip(events, acks, strict=True):
            if isinstance(event, Completion):
                self.ledger.acknowledged_end(ack.partition, ack.offset)
        for event in events:
            self.sent[_TOPIC_OF[type(event)]] += 1

    def counts(self) -> FleetCounts:
        return FleetCounts(
            decisions=self.decisions,
            duplicates=self.duplicates,
            gateway_requests=self.gateway_requests,
            invalid=self.invalid,
            first_tokens=self.sent[FIRST_TOKENS],
            completions=self.sent[COMPLETIONS],
            responses=self.sent[RESPONSES],
            kv_events=self.sent[KV_EVENTS],
            heartbeats=self.sent[HEARTBEATS],
            reconnects=self.reconnects,
            answered_again=self.answered_again,
        )


class _Liveness:
    """``check()`` raises ``BrokerLost`` when the consumer no longer really consumes: its
    fetches unanswered for ``fetch_stale_s`` while assigned, or no partitions for
    ``unassigned_s``. It returns the partitions whose high watermark fell below one seen before
    (the broker lost their log) for the caller to read again from the start."""

    def __init__(self, consumer: Any, limits: Reconnect) -> None:
        self.consumer, self.limits = consumer, limits
        self._checked = 0.0
        self._answered = self._assigned_at = time.monotonic()
        self._stamps: dict[Any, int] = {}
        self._highest: dict[Any, int] = {}

    def check(self) -> list[Any]:
        now = time.monotonic()
        if now - self._checked < self.limits.probe_s:
            return []
        self._checked = now
        partitions = self.consumer.assignment()
        if not partitions:
            if now - self._assigned_at > self.limits.unassigned_s:
                raise BrokerLost(f"no partition assigned for {self.limits.unassigned_s:.0f} s")
            self._answered = now
            return []
        self._assigned_at = now
        lost = []
        for tp in partitions:
            stamp = self.consumer.last_poll_timestamp(tp)
            if stamp is not None and stamp != self._stamps.get(tp):
                self._stamps[tp] = stamp
                self._answered = now
            mark = self.consumer.highwater(tp)
            if mark is not None:
                if mark < self._highest.get(tp, 0):
                    lost.append(tp)
                self._highest[tp] = mark
        if now - self._answered > self.limits.fetch_stale_s:
            raise BrokerLost(f"no fetch answered for {self.limits.fetch_stale_s:.0f} s")
        return lost
