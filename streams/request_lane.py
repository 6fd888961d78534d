"""The request lane: ``tf.requests`` read in large batches with a plain aiokafka consumer.

Why not a Faust agent: Faust spends far more CPU per message (event objects, per-message acks)
before our code runs than a decision takes (docs/results/speed.md). This lane reads raw
batches (thousands of messages per fetch), hands them to the routing handler, and commits the
batch's offsets once its decisions are delivered (at least once).

Which partitions: those the deciders' consumer group gives this worker
(``streams.membership.Membership`` calls ``follow`` after each rebalance). The lane reads on a
consumer of its own, by assignment, so it goes on routing what it owns while the group
rebalances, and changes what it reads only when the new assignment says so.

Exactly one decision per request, over restarts and rebalances (with the handler's help):
- a batch's offsets are committed once its decisions are delivered, but never past
  ``commit_floor()`` (the oldest request still held, per partition), so a request held when
  the worker stops is read again by whoever takes the partition;
- before the first batch of a newly assigned partition is handled, the decisions sent on
  ``replay_topic`` (``tf.admission``, same partition number: both keyed by the request's
  affinity key) since that batch's first record was written are handed to ``on_replay``, so
  requests decided before and read again are recognised (found with ``offsets_for_times``; from
  the partition's start if the broker cannot answer it);
- a newly assigned partition is not read at all until ``handoff`` says its previous owner let
  go of it (``streams.handoff``: the old owner may still be deciding its requests when the
  group hands it over, and lets go only once its decisions are delivered); the lane's other
  partitions are read meanwhile. Without a ``handoff`` the replay waits ``handoff_grace_s``
  instead: a guess at how long a live old owner's last decisions take to reach the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from schemas.codec import RawMessage
from streams.clients import ConsumerLoop, stop_client
from streams.connection import BrokerConnection

log = logging.getLogger(__name__)

Position = tuple[int, int]
"""(partition, offset) of a message."""
Handler = Callable[[Sequence[RawMessage], Sequence[Position]], Awaitable[Awaitable[object]]]
"""Decides on a batch and sends the results; returns an awaitable that completes on delivery."""
Replay = Callable[[Sequence[RawMessage]], Awaitable[None]]
Released = Callable[[set[int]], Awaitable[None]]
"""Returns once no other decider reads these partitions any more (``streams.handoff.Handoff``)."""
_REPLAY_MARGIN_MS = 5_000  # clock skew between the writers of requests and of decisions
_REPLAY_LIMIT_S = 60.0


class RequestLane:
    def __init__(
        self,
        connection: BrokerConnection,
        topic: str,
        group_id: str,
        max_batch: int = 256,
        max_in_flight: int = 8,
        fetch_max_wait_ms: int = 10,
        commit_interval_s: float = 0.1,
        replay_topic: str | None = None,
        handoff_grace_s: float = 0.5,
        handoff: Released | None = None,
    ) -> None:
        self.topic = topic
        self.handoff_grace_s = handoff_grace_s
        self.handoff = handoff
        self._fenced: set[int] = set()  # assigned, paused until their previous owner let go
        self._fence: asyncio.Task[None] | None = None
        self.handler: Handler | None = None
        self.commit_floor: Callable[[], Mapping[int, int]] = dict
        self.replay_topic = replay_topic
        self.on_replay: Replay | None = None
        self._fresh: set[int] = set()  # assigned, decisions not replayed yet
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.commit_interval_s = commit_interval_s
        self._connection = connection
        self._reader = ConsumerLoop(
            "request lane",
            {
                **connection.client_options(),
                # Committed offsets only: partitions are assigned by hand, and the group has no
                # members (Kafka takes commits from outside a group only for an empty group).
                "group_id": group_id,
                "enable_auto_commit": False,
                "auto_offset_reset": "earliest",
                "fetch_max_wait_ms": fetch_max_wait_ms,
                "max_partition_fetch_bytes": 4 * 1024 * 1024,
            },
        )
        self._producer: Any = None
        self.sending = False  # its producer takes messages: from ``start`` until ``stop``
        self._partitioner = DefaultPartitioner()
        self._partition_cache: dict[tuple[bytes, int], int] = {}
        self._lock: asyncio.Lock | None = None  # held while a batch is in flight; rebalances wait
        self._send_order: asyncio.Lock | None = None  # hands batches to the producer in order
        self._wanted: set[int] = set()  # what the deciders' group gave us
        self._assigned: set[int] = set()  # what the consumer reads now
        # Batches handed to the handler, delivery awaited, in read order (offsets to commit).
        self._in_flight: deque[tuple[Awaitable[object], dict[Any, int]]] = deque()
        self._delivered: dict[Any, int] = {}  # offsets delivered, not yet committed
        self._committed_at = 0.0
        self.last_fetch_ok: float | None = None  # monotonic: the broker last answered our fetch
        self._fetch_seen: dict[Any, int] = {}  # partition -> its last fetch response (wall ms)

    def attach(
        self,
        handler: Handler,
        commit_floor: Callable[[], Mapping[int, int]] = dict,
        on_replay: Replay | None = None,
    ) -> None:
        """Who decides on the lane's batches (``streams.binding.bind`` attaches the agents):
        ``handler`` per batch, ``commit_floor`` per commit, ``on_replay`` before a newly assigned
        partition's first batch. Called once, before the app starts."""
        self.handler, self.commit_floor, self.on_replay = handler, commit_floor, on_replay

    async def start(self) -> None:
        """Create and start the producer, then the consumer and its reading task (inside the
        worker's event loop)."""
        self._lock = asyncio.Lock()
        self._send_order = asyncio.Lock()
        # Our own producer for the lane's output: Faust's per-message send path costs ~3x more.
        self._producer = AIOKafkaProducer(
            **self._connection.client_options(), linger_ms=2, max_batch_size=1 << 20
        )
        await self._producer.start()
        self.sending = True
        await self._reader.start(self._run)

    @property
    def _consumer(self) -> Any:
        return self._reader.consumer

    @property
    def partitions(self) -> set[int]:
        """The partitions the lane reads now (a lost one only once its batches in flight were
        delivered and committed; a new one before its hand-off fence opened)."""
        return set(self._assigned)

    @property
    def running(self) -> bool:
        """Started and not stopped (its producer can take messages)."""
        return self._reader.running

    def healthy(self, max_age_s: float) -> bool:
        """Running, reading partitions, and the broker answered one of its fetches within
        ``max_age_s`` (an empty answer counts: it is the broker saying there is nothing new; a
        partition waiting for its hand-off is not fetched, so a lane whose every partition
        waits is not healthy yet)."""
        return (
            self.running
            and bool(self._assigned)
            and self.last_fetch_ok is not None
            and time.monotonic() - self.last_fetch_ok <= max_age_s
        )

    def status(self) -> dict[str, Any]:
        """What ``healthy`` looks at, and each partition's high watermark as last fetched (a
        watermark that goes down means the broker lost its log)."""
        age = None if self.last_fetch_ok is None else round(time.monotonic() - self.last_fetch_ok, 3)
        highwater: dict[str, int] = {}
        if self._consumer is not None:
            for tp in self._consumer.assignment():
                mark = self._consumer.highwater(tp)
                if mark is not None:
                    highwater[f"{tp.topic}:{tp.partition}"] = int(mark)
        return {
            "running": self.running,
            "partitions": sorted(self._assigned),
            "last_fetch_age_s": age,
            "highwater": highwater,
        }

    def _note_fetches(self) -> None:
        """Record when a fetch of ours was last answered (aiokafka stamps each partition's
        fetch response, empty or not)."""
        for tp in self._consumer.assignment():
            stamp = self._consumer.last_poll_timestamp(tp)
            if stamp is not None and stamp != self._fetch_seen.get(tp):
                self._fetch_seen[tp] = stamp
                self.last_fetch_ok = time.monotonic()

    async def send_many(self, topic: str, messages: Sequence[tuple[bytes, bytes]]) -> Awaitable[object]:
        """Queue ``(key, value)`` messages, one record batch per partition (keys hashed as every
        Kafka client does); the returned awaitable completes when the broker has them all.

        Per-message ``send`` costs Python per message; filling batches directly is far cheaper.
        The batches are built (and their records time-stamped) now, and handed to the producer
        by a task: aiokafka's ``send_batch`` waits while the partition's previous batch is still
        queued (one produce request in flight per broker), and the lane must not wait with it,
        or requests pile up behind every round trip. Tasks hand over in creation order (a FIFO
        lock), so a partition's decisions keep their order.
        """
        partitions = sorted(await self._producer.partitions_for(topic))
        by_partition: dict[int, list[tuple[bytes, bytes]]] = {}
        for key, value in messages:
            by_partition.setdefault(self._partition_of(key, partitions), []).append((key, value))
        batches = []
        for partition, items in by_partition.items():
            batch = self._producer.create_batch()
            for key, value in items:
                if batch.append(timestamp=None, key=key, value=value) is None:  # full: start another
                    batches.append((partition, batch))
                    batch = self._producer.create_batch()
                    batch.append(timestamp=None, key=key, value=value)
            batches.append((partition, batch))
        return asyncio.ensure_future(self._hand_over(topic, batches))

    async def _hand_over(self, topic: str, batches: Sequence[tuple[int, Any]]) -> None:
        assert self._send_order is not None
        async with self._send_order:
            delivered = [await self._producer.send_batch(b, topic, partition=p) for p, b in batches]
        await asyncio.gather(*delivered)

    async def partition_count(self) -> int:
        """How many partitions ``tf.requests`` has (as the broker last said)."""
        return len(await self._producer.partitions_for(self.topic))

    def _partition_of(self, key: bytes, partitions: list[int]) -> int:
        cached = self._partition_cache.get((key, len(partitions)))
        if cached is None:
            cached = self._partitioner(key, partitions, partitions)
            self._partition_cache[(key, len(partitions))] = cached
        return int(cached)

    async def stop_reading(self, grace_s: float = 2.0) -> None:
        """Stop reading; deliver and commit the batches in flight (for up to ``grace_s``: a
        broker that is away gets them read again by the partitions' next owners). The producer
        still takes messages (``sending``) until ``stop``."""
        if self._fence is not None:
            self._fence.cancel()
        if self._lock is not None and self._reader.running:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._finish(), grace_s)
        await self._reader.stop()

    async def stop(self) -> None:
        """``stop_reading`` (if not done yet), then stop the producer."""
        await self.stop_reading()
        self.sending = False
        if self._producer is not None:
            await stop_client(self._producer)

    async def _finish(self) -> None:
        assert self._lock is not None and self._reader.task is not None
        async with self._lock:  # (between two batches)
            self._reader.task.cancel()
            await self._settle(keep=0)

    async def follow(self, partitions: set[int]) -> set[int]:
        """The deciders' group gave this worker ``partitions``: read them from now on. For the
        partitions it lost, await the delivery of every batch in flight and commit it before
        letting them go (so the new owner starts past every request decided here, and the
        consumer never commits a partition it no longer reads). Returns the lost partitions
        (their held requests must be let go too: the new owner reads them again)."""
        lost = self._wanted - partitions
        self._wanted = set(partitions)
        if self._lock is not None and self._consumer is not None:
            async with self._lock:
                if lost:
                    await self._settle(keep=0)
                if self._wanted != self._assigned:
                    self._assign(self._wanted)
        return lost

    def _assign(self, partitions: set[int]) -> None:
        gained = partitions - self._assigned
        self._fresh = (self._fresh & partitions) | gained
        self._assigned = set(partitions)
        self._consumer.assign([TopicPartition(self.topic, p) for p in sorted(partitions)])
        log.info("request lane reads %s partitions %s", self.topic, sorted(partitions))
        if self.handoff is not None:
            self._fenced = (self._fenced & partitions) | gained
            if self._fence is not None:
                self._fence.cancel()  # (a new assignment: one fence for all that still wait)
                self._fence = None
            if self._fenced:
                # ``assign`` resumed every partition: pause again those still fenced.
                self._consumer.pause(*(TopicPartition(self.topic, p) for p in sorted(self._fenced)))
                self._fence = asyncio.create_task(self._open_fence(set(self._fenced)))

    async def _open_fence(self, partitions: set[int]) -> None:
        """Resume ``partitions`` once their previous owner let go of them."""
        assert self.handoff is not None
        await self.handoff(partitions)
        opened = partitions & self._fenced & self._assigned
        self._fenced -= partitions
        if opened:
            self._consumer.resume(*(TopicPartition(self.topic, p) for p in sorted(opened)))

    async def _run(self) -> None:
        """Fetch, handle, and commit batches once their output is delivered. Up to
        ``max_in_flight`` batches await delivery at once (the broker's round trip does not cap
        throughput); offsets are committed in order, each after its batch was delivered."""
        assert self._lock is not None
        in_flight = self._in_flight
        while True:
            async with self._lock:
                if self._wanted != self._assigned:
                    await self._settle(keep=0)
                    self._assign(self._wanted)
                batches: dict[Any, list[Any]] = {}
                if self._assigned:
                    batches = await self._consumer.getmany(timeout_ms=50, max_records=self.max_batch)
                    self._note_fetches()
                messages = [(m.key, m.value) for records in batches.values() for m in records]
                positions = [(m.partition, m.offset) for records in batches.values() for m in records]
                if messages and self._fresh:
                    await self._replay_for(batches)
                if messages:
                    try:
                        assert self.handler is not None, "RequestLane.attach was not called"
                        delivered = await self.handler(messages, positions)
                    except Exception:
                        await self._settle(keep=0)
                        await self._rewind(batches, len(messages))
                        continue
                    ends = {tp: records[-1].offset + 1 for tp, records in batches.items() if records}
                    in_flight.append((asyncio.ensure_future(delivered), ends))
                    await self._settle(keep=self.max_in_flight - 1)
                else:
                    await self._settle(keep=0)
            if not messages:
                await asyncio.sleep(0.005 if self._assigned else 0.05)

    async def _settle(self, keep: int) -> None:
        """Take delivered batches in order, waiting for the oldest until at most ``keep`` remain;
        commit their offsets every ``commit_interval_s``, and always when nothing stays in flight.

        Why not one commit per batch: at a few thousand requests per second batches are small
        (tens of requests), and each commit is a broker request and a round trip the lane
        waits for. A worker that dies re-routes at most one interval of requests (at least
        once, as before)."""
        in_flight = self._in_flight
        while in_flight and (len(in_flight) > keep or _done(in_flight[0][0])):
            delivered, ends = in_flight.popleft()
            await delivered
            self._delivered.update(ends)
        if keep == 0 or time.monotonic() - self._committed_at >= self.commit_interval_s:
            await self._commit()

    async def _commit(self) -> None:
        """Commit the offsets of every batch delivered so far, but not past a held request."""
        if self._delivered:
            ends, self._delivered = self._delivered, {}
            floor = self.commit_floor()
            ends = {tp: min(end, floor.get(tp.partition, end)) for tp, end in ends.items()}
            self._committed_at = time.monotonic()
            await self._consumer.commit(ends)

    async def _replay_for(self, batches: dict[Any, list[Any]]) -> None:
        """Replay the decisions of the fresh partitions this fetch brought records of."""
        fresh = {tp.partition: records[0].timestamp for tp, records in batches.items() if records}
        fresh = {p: ts for p, ts in fresh.items() if p in self._fresh}
        if not fresh:
            return
        self._fresh -= set(fresh)
        if self.replay_topic is None or self.on_replay is None:
            return
        if self.handoff is None:  # (with a fence, the old owner's decisions are delivered by now)
            await asyncio.sleep(self.handoff_grace_s)
        since_ms = max(0, min(fresh.values()) - _REPLAY_MARGIN_MS)
        started = time.monotonic()
        count = await self._replay(set(fresh), since_ms)
        log.info(
            "request lane: replayed %d decisions of %s partitions %s in %.2f s",
            count, self.replay_topic, sorted(fresh), time.monotonic() - started,
        )  # fmt: skip

    async def _replay(self, partitions: set[int], since_ms: int) -> int:
        """Hand ``on_replay`` every record of ``replay_topic`` partitions written since
        ``since_ms`` (to their end as of now); returns how many."""
        assert self.replay_topic is not None and self.on_replay is not None
        consumer = AIOKafkaConsumer(
            **self._connection.client_options(),
            enable_auto_commit=False,
            fetch_max_wait_ms=self._reader.options["fetch_max_wait_ms"],
        )
        await consumer.start()
        try:
            tps = [TopicPartition(self.replay_topic, p) for p in sorted(partitions)]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            try:
                starts = await consumer.offsets_for_times({tp: since_ms for tp in tps})
            except Exception:  # the broker cannot look up by time: replay the whole partition
                log.warning("request lane: offsets_for_times unsupported; replaying from the start")
                starts = {}
            for tp in tps:
                found = starts.get(tp)
                if tp in starts and found is None:
                    consumer.seek(tp, ends[tp])  # nothing written since: nothing to replay
                elif found is None:
                    await consumer.seek_to_beginning(tp)
                else:
                    consumer.seek(tp, found.offset)
            count, deadline = 0, time.monotonic() + _REPLAY_LIMIT_S
            while time.monotonic() < deadline:
                positions = [await consumer.position(tp) for tp in tps]
                if all(at >= ends[tp] for at, tp in zip(positions, tps, strict=True)):
                    return count
                batch = await consumer.getmany(timeout_ms=200, max_records=10_000)
                messages = [(m.key, m.value) for records in batch.values() for m in records]
                count += len(messages)
                await self.on_replay(messages)
            log.warning("request lane: replay of %s stopped after %.0f s", self.replay_topic, _REPLAY_LIMIT_S)
            return count
        finally:
            await stop_client(consumer)

    async def _rewind(self, batches: dict[Any, list[Any]], size: int) -> None:
        """Never drop a batch: seek back to its start and read it again after a pause."""
        log.exception("request lane: handling a batch of %d failed; retrying it", size)
        for tp, records in batches.items():
            if records:
                self._consumer.seek(tp, records[0].offset)
        await asyncio.sleep(1.0)


def _done(awaitable: Awaitable[object]) -> bool:
    return isinstance(awaitable, asyncio.Future) and awaitable.done()
