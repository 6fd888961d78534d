"""The shared log: every partition of the state topics, read by every decider.

Several deciders serve one pool, each owning some partitions of ``tf.requests``. What they
decide with must be the same for all of them: the pool's heartbeats (``tf.heartbeats``), the
engines' KV events, first tokens and completions, each other's placements (``tf.decisions``)
and, where the admission stage counts the pool's holds (SLOMax), each other's holds
(``tf.admission``). So every worker reads those topics whole, with a consumer of its own that
belongs to no group (``assign``, never ``subscribe``), and hands each batch to the handler of
its topic; the deciders' accounting then agrees up to how late each reads.

Where it starts: heartbeats ``heartbeat_lookback_s`` back (the newest heartbeat of each instance
is its state: a worker that starts or restarts knows the fleet at once); every other topic at
its end (an event from before the start concerns placements this worker does not know; the
heartbeats reconcile them). A topic that does not exist yet is looked for again until it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

from aiokafka import TopicPartition

from schemas.codec import RawMessage
from streams.clients import ConsumerLoop
from streams.connection import BrokerConnection

log = logging.getLogger(__name__)

BatchHandler = Callable[[Sequence[RawMessage]], Awaitable[None]]


class SharedLog:
    def __init__(
        self,
        connection: BrokerConnection,
        handlers: Mapping[str, BatchHandler],
        *,
        heartbeat_topic: str,
        heartbeat_lookback_s: float = 10.0,
        fetch_max_wait_ms: int = 10,
        max_batch: int = 2_000,
    ) -> None:
        """``handlers``: topic name -> what takes a batch of its raw messages (in log order per
        partition)."""
        self.handlers = dict(handlers)
        self.heartbeat_topic, self.heartbeat_lookback_s = heartbeat_topic, heartbeat_lookback_s
        self.max_batch = max_batch
        self._reader = ConsumerLoop(
            "shared log",
            {
                **connection.client_options(),
                "enable_auto_commit": False,
                "fetch_max_wait_ms": fetch_max_wait_ms,
                "max_partition_fetch_bytes": 4 * 1024 * 1024,
            },
        )
        self._reading: set[TopicPartition] = set()
        self._fetch_seen: dict[TopicPartition, int] = {}
        self.last_fetch_ok: float | None = None  # monotonic: the broker last answered a fetch

    async def start(self) -> None:
        await self._reader.start(self._run)

    @property
    def running(self) -> bool:
        return self._reader.running

    def fresh(self, max_age_s: float) -> bool:
        """Reading every state topic, and the broker answered one of its fetches within
        ``max_age_s``."""
        return (
            self.running
            and {tp.topic for tp in self._reading} == set(self.handlers)
            and self.last_fetch_ok is not None
            and time.monotonic() - self.last_fetch_ok <= max_age_s
        )

    def highwater(self) -> dict[str, int]:
        """Each partition's high watermark as last fetched (one that goes down: the broker lost
        its log)."""
        marks: dict[str, int] = {}
        consumer = self._reader.consumer
        if consumer is not None:
            for tp in self._reading:
                mark = consumer.highwater(tp)
                if mark is not None and mark >= 0:
                    marks[f"{tp.topic}:{tp.partition}"] = int(mark)
        return marks

    async def stop(self) -> None:
        await self._reader.stop()

    async def _run(self) -> None:
        consumer = self._reader.consumer
        next_look = 0.0
        while True:
            if time.monotonic() >= next_look:  # new topics or partitions: read them too
                next_look = time.monotonic() + 5.0
                await self._read_new_partitions()
            if not self._reading:
                await asyncio.sleep(0.2)
                continue
            batches = await consumer.getmany(timeout_ms=100, max_records=self.max_batch)
            self._note_fetches()
            for tp, records in batches.items():
                if records:
                    await self._handle(tp.topic, [(m.key, m.value) for m in records])

    async def _handle(self, topic: str, messages: list[RawMessage]) -> None:
        try:
            await self.handlers[topic](messages)
        except Exception:  # one bad batch must not stop the worker's view of the fleet
            log.exception("shared log: handling %d messages of %s failed; going on", len(messages), topic)

    async def _read_new_partitions(self) -> None:
        """Add the partitions of the handled topics that exist now and are not read yet, each
        from where it should start (see the module docstring)."""
        consumer = self._reader.consumer
        with contextlib.suppress(Exception):  # refreshes the metadata; none yet: look again later
            await consumer.topics()
        found = {
            TopicPartition(topic, p)
            for topic in self.handlers
            for p in consumer.partitions_for_topic(topic) or ()
        }
        new = found - self._reading
        if not new:
            return
        consumer.assign(sorted(self._reading | new))
        ends = await consumer.end_offsets(list(new))
        beats = [tp for tp in new if tp.topic == self.heartbeat_topic]
        since_ms = int((time.time() - self.heartbeat_lookback_s) * 1000)
        try:
            starts = await consumer.offsets_for_times({tp: since_ms for tp in beats}) if beats else {}
        except Exception:  # the broker cannot look up by time: the whole partition
            starts = None
        for tp in new:
            if tp.topic != self.heartbeat_topic:
                consumer.seek(tp, ends[tp])
            elif starts is None:
                await consumer.seek_to_beginning(tp)
            else:
                at = starts.get(tp)
                consumer.seek(tp, ends[tp] if at is None else at.offset)
        self._reading |= new
        log.info("shared log: reading %d more partitions (%d in all)", len(new), len(self._reading))

    def _note_fetches(self) -> None:
        consumer = self._reader.consumer
        for tp in self._reading:
            stamp = consumer.last_poll_timestamp(tp)
            if stamp is not None and stamp != self._fetch_seen.get(tp):
                self._fetch_seen[tp] = stamp
                self.last_fetch_ok = time.monotonic()
