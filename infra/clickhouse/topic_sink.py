"""The topic sink: the feedback tables are fed from the log, and a message's offset is committed
only once the store has acknowledged its row.

Why: the rows used to be written from the router's memory (the request handler, the log's
keeper) while Faust committed the offsets on its own; a worker killed with rows still in its
store's memory buffer lost them for good. Here the log is the only source of rows and the
committed offset is the store's acknowledgement, so a row is either durable or still on the
log for whoever reads the partition next.

Contract:

- One ``TopicSink`` per worker, a member of the consumer group ``<app id>-store``
  (``store_group``) subscribed to the topics of ``TOPIC_TABLES``, one feedback table each.
  Kafka spreads their partitions over the workers; a dead worker's partitions go to the others
  once its session times out (or at once when it leaves the group on a clean stop). A new
  group starts at the log's beginning: the store keeps what the log still holds.
- Each fetched batch is decoded (a message that does not decode is skipped and counted in
  ``tokenfleet_feedback_skipped_messages_total``: dead-lettering it is the job of the
  request handler and ``agents.keeping.LogKeeper``) and handed to the store table by table
  (``RowStore.write``). The store acknowledges a write once its rows are durable: written to
  ClickHouse, quarantined, or fsync'd to the spool (``infra/clickhouse/feedback.py``).
- Offsets are committed batch by batch in the order the batches were read, and only for
  batches whose every write was acknowledged: a partition's committed offset never passes a
  row the store has not made durable.
- At least once, stored once: a sink that dies before committing leaves its rows on the log
  to the partition's next owner, which reads them again; rows the dead sink had stored are
  skipped by event_id (``infra/clickhouse/sink.py``), so every row is stored once.
- A rebalance (Kafka's eager protocol revokes every partition first): the sink waits up to
  ``revoke_grace_s`` for the acknowledgements of what it has handed over, commits what was
  acknowledged, and forgets the rest (the next owner reads it again). Batches handed over
  under an older assignment are never committed.
- A write the store could not keep (``RowsLost``: its memory buffer or spool was full, the
  disk failed): the sink reads again from the oldest offset not committed, after ``retry_s``.
- Back-pressure: while more than ``max_pending_rows`` rows wait for their acknowledgement,
  the sink pauses its partitions (it keeps polling, so it stays in the group).
- ``stop(grace_s)``: waits up to ``grace_s`` for acknowledgements, commits them, leaves the
  group. Stop it *before* closing the store (which acknowledges what it spools at close).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.errors import KafkaError

from infra import metrics
from infra.kafka.connection import KafkaConnection
from schemas import topics
from schemas.codec import DecodeError, decode
from schemas.events import Event
from streams.clients import ConsumerLoop

log = logging.getLogger(__name__)

TOPIC_TABLES: dict[topics.TopicSpec, str] = {
    topics.REQUESTS: "requests",
    topics.ADMISSION: "admission_decisions",
    topics.DECISIONS: "routing_decisions",
    topics.COMPLETIONS: "completions",
    topics.FLEET_EVENTS: "fleet_events",
    topics.HEARTBEATS: "heartbeats",
    topics.PLANS: "replica_plans",
}
"""Every topic whose messages are rows, and the feedback table each one fills."""

STORE_SUFFIX = "-store"


def store_group(app_id: str) -> str:
    """The consumer group whose members share the partitions the store is fed from."""
    return f"{app_id}{STORE_SUFFIX}"


class RowStore(Protocol):
    def write(self, table: str, events: Sequence[Event]) -> Future[None]:
        """Take ``events`` for ``table`` without blocking; the result completes once they are
        durable, or fails if any of them was dropped (``ClickHouseFeedback.write``)."""
        ...


@dataclass
class _Handed:
    """One fetched batch handed to the store: where it starts and ends per partition, and the
    store's acknowledgements of its writes."""

    epoch: int
    starts: dict[TopicPartition, int]
    ends: dict[TopicPartition, int]  # the offset to commit: one past the batch's last message
    acks: list[Future[None]] = field(default_factory=list)
    rows: int = 0

    def acknowledged(self) -> bool:
        return all(ack.done() and ack.exception() is None for ack in self.acks)

    def failed(self) -> BaseException | None:
        for ack in self.acks:
            if ack.done() and ack.exception() is not None:
                return ack.exception()
        return None


class TopicSink(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(
        self,
        connection: KafkaConnection,
        group_id: str,
        store: RowStore,
        *,
        session_timeout_s: float,
        rebalance_timeout_s: float,
        heartbeat_interval_s: float,
        fetch_max_wait_ms: int = 100,
        max_records: int = 500,
        max_pending_rows: int = 20_000,
        revoke_grace_s: float = 2.0,
        retry_s: float = 1.0,
    ) -> None:
        """The group timeouts as the worker's other consumers have them (the embedded Tansu
        holds a join for half the rebalance timeout: keep them low there). ``max_pending_rows``
        should stay below the store's memory buffer (``feedback_buffer_rows``), so back-pressure
        comes before the buffer drops rows. ``max_records`` bounds a batch: it is decoded on the
        worker's event loop, so a batch holds the routing up for as long as its decoding takes."""
        self.group_id = group_id
        self.store = store
        self.max_records = max_records
        self.max_pending_rows = max_pending_rows
        self.revoke_grace_s = revoke_grace_s
        self.retry_s = retry_s
        self.committed: dict[TopicPartition, int] = {}  # what this sink committed, per partition
        self._reader = ConsumerLoop(
            f"store sink {group_id}",
            {
                **connection.client_options(),
                "group_id": group_id,
                "enable_auto_commit": False,  # committed by hand, after the store's acknowledgement
                "auto_offset_reset": "earliest",
                "partition_assignment_strategy": (StickyPartitionAssignor,),
                "session_timeout_ms": int(session_timeout_s * 1000),
                "rebalance_timeout_ms": int(rebalance_timeout_s * 1000),
                "heartbeat_interval_ms": int(heartbeat_interval_s * 1000),
                "fetch_max_wait_ms": fetch_max_wait_ms,
            },
        )
        self._kinds = {spec.name: spec.event for spec in TOPIC_TABLES}
        self._tables = {spec.name: table for spec, table in TOPIC_TABLES.items()}
        self._handed: deque[_Handed] = deque()  # in the order read
        self._acknowledged: dict[TopicPartition, int] = {}  # to commit (a commit failed, or not tried)
        self._epoch = 0  # one more at every revocation: older batches are never committed
        self._paused = False

    @property
    def pending_rows(self) -> int:
        """Rows handed to the store and not yet committed."""
        return sum(h.rows for h in self._handed)

    async def start(self) -> None:
        """Start the consumer (inside the worker's event loop) and the sink's loop."""
        await self._reader.start(self._run, topics=[spec.name for spec in TOPIC_TABLES], listener=self)

    @property
    def _consumer(self) -> Any:
        return self._reader.consumer

    async def stop(self, grace_s: float = 5.0) -> None:
        """Stop reading; commit what the store acknowledges within ``grace_s``; leave the group."""
        await self._reader.stop_reading()
        if self._consumer is None:
            return
        try:
            await self._settle(grace_s)
        finally:
            self._handed.clear()
            await self._reader.stop()  # leaves the group: the others take over

    # -- the loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                # Handed over at once (no await between): aiokafka returns only records of the
                # partitions assigned now, so the batch belongs to the current epoch.
                batches = await self._consumer.getmany(timeout_ms=1000, max_records=self.max_records)
                if batches:
                    self._hand_over(batches)
                await self._commit_acknowledged()
                self._pace()
            except asyncio.CancelledError:
                raise
            except Exception:  # the coordinator reconnects by itself; keep going
                log.exception("store sink %s: poll or commit failed", self.group_id)
                await asyncio.sleep(self.retry_s)

    def _hand_over(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """Decode ``batches`` and hand the rows to the store, one write per table."""
        handed = _Handed(self._epoch, {}, {})
        rows: dict[str, list[Event]] = {}
        for tp, records in batches.items():
            if not records:
                continue
            handed.starts[tp] = records[0].offset
            handed.ends[tp] = records[-1].offset + 1
            kind, table = self._kinds[tp.topic], self._tables[tp.topic]
            for record in records:
                try:
                    rows.setdefault(table, []).append(decode(kind, record.value))
                except DecodeError:
                    metrics.feedback_skipped_messages_total.labels(topic=tp.topic).inc()
        for table, events in rows.items():
            handed.acks.append(self.store.write(table, events))
            handed.rows += len(events)
        if handed.ends:
            self._handed.append(handed)

    def _pace(self) -> None:
        """Pause the partitions while too many rows wait for the store; resume when they do not."""
        over = self.pending_rows > self.max_pending_rows
        if over and not self._paused:
            log.warning(
                "store sink %s: %d rows wait for the store; pausing its partitions",
                self.group_id,
                self.pending_rows,
            )
            self._consumer.pause(*self._consumer.assignment())
        elif self._paused and not over:
            self._consumer.resume(*self._consumer.paused())
        self._paused = over

    async def _commit_acknowledged(self, read_again: bool = True) -> None:
        """Commit the oldest batches the store has acknowledged, in order; on a batch whose
        rows the store lost, read again from where the commits stopped (``read_again``)."""
        while self._handed and self._handed[0].acknowledged():
            handed = self._handed.popleft()
            if handed.epoch == self._epoch:
                self._acknowledged.update(handed.ends)
        assigned = self._consumer.assignment()
        for tp in [tp for tp in self._acknowledged if tp not in assigned]:
            del self._acknowledged[tp]  # no longer ours: its next owner starts from the last commit
        if self._acknowledged:
            offsets = dict(self._acknowledged)
            try:
                await self._consumer.commit(offsets)
            except KafkaError as exc:  # a rebalance under way: tried again, or read again by the next owner
                log.info("store sink %s: commit failed (%s); tried again", self.group_id, exc)
            else:
                self.committed.update(offsets)
                for tp, offset in offsets.items():
                    if self._acknowledged.get(tp) == offset:
                        del self._acknowledged[tp]
        if read_again and self._handed and (error := self._handed[0].failed()) is not None:
            await self._read_again(error)

    async def _read_again(self, error: BaseException) -> None:
        """The store lost rows of the oldest batch: every batch handed after the last commit
        is read again (what was stored meanwhile is skipped by event_id)."""
        starts: dict[TopicPartition, int] = {}
        for handed in self._handed:
            if handed.epoch != self._epoch:
                continue
            for tp, offset in handed.starts.items():
                starts[tp] = min(offset, starts.get(tp, offset))
        self._handed.clear()
        log.warning(
            "store sink %s: the store lost rows (%s); reading %d partitions again in %.1f s",
            self.group_id,
            error,
            len(starts),
            self.retry_s,
        )
        epoch = self._epoch
        await asyncio.sleep(self.retry_s)
        if epoch != self._epoch:
            return  # a rebalance came meanwhile: the new assignment starts from the commits
        assigned = self._consumer.assignment()
        for tp, offset in starts.items():
            if tp in assigned:
                self._consumer.seek(tp, offset)

    async def _settle(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the store's acknowledgements, then commit what it
        acknowledged (in order)."""
        acks = [asyncio.wrap_future(ack) for h in self._handed if h.epoch == self._epoch for ack in h.acks]
        if acks and timeout_s > 0:
            await asyncio.wait(acks, timeout=timeout_s)
        try:
            await self._commit_acknowledged(read_again=False)
        except Exception as exc:  # the partitions' next owner reads the rows again
            log.warning("store sink %s: commit failed (%s)", self.group_id, exc)

    # -- the rebalance listener ---------------------------------------------------------------

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """Commit what the store acknowledges within ``revoke_grace_s``; forget the rest."""
        try:
            await self._settle(self.revoke_grace_s)
        finally:
            self._epoch += 1
            self._handed.clear()
            self._acknowledged.clear()  # not ours to commit any more
            self._paused = False

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        log.info("store sink %s: %d partitions assigned", self.group_id, len(assigned))
