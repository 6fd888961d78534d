"""The request lane's hand-off of partitions, on a fake consumer (no broker).

The fake behaves as aiokafka's consumer does where it matters here: ``commit`` refuses a
partition that is not assigned (``IllegalStateError``), and ``getmany`` returns only records of
assigned partitions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError

from infra.kafka.connection import KafkaConnection
from schemas.codec import RawMessage
from streams.request_lane import Position, Released, RequestLane

TOPIC = "tf.requests"


@dataclass
class _Record:
    partition: int
    offset: int
    key: bytes = b"k"
    value: bytes = b"{}"
    timestamp: int = 0


class _FakeConsumer:
    def __init__(self, pending: dict[int, list[_Record]], busy: int | None = None) -> None:
        self.pending = pending  # partition -> records not read yet
        self.busy = busy  # a partition with a new record at every fetch (traffic never stops)
        self.written: dict[int, int] = {}  # busy partition -> records written so far
        self.assigned: set[TopicPartition] = set()
        self.paused: set[TopicPartition] = set()
        self.commits: list[tuple[dict[int, int], set[int]]] = []  # offsets, assigned at the time

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = set(tps)
        self.paused = set()  # as aiokafka: a new assignment is not paused

    def pause(self, *tps: TopicPartition) -> None:
        self.paused |= set(tps) & self.assigned

    def resume(self, *tps: TopicPartition) -> None:
        self.paused -= set(tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def last_poll_timestamp(self, tp: TopicPartition) -> int:
        return 1

    def highwater(self, tp: TopicPartition) -> int | None:
        return None

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[_Record]]:
        out = {}
        for tp in self.assigned - self.paused:
            records = self.pending.pop(tp.partition, [])
            if tp.partition == self.busy:
                offset = self.written[tp.partition] = self.written.get(tp.partition, 0) + 1
                records.append(_Record(tp.partition, offset - 1))
            if records:
                out[tp] = records
        await asyncio.sleep(0.001 if out else timeout_ms / 1000)  # a fetch is a round trip
        return out

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        for tp in offsets:
            if tp not in self.assigned:
                raise IllegalStateError(f"Partition {tp} is not assigned")
        self.commits.append(
            ({tp.partition: o for tp, o in offsets.items()}, {tp.partition for tp in self.assigned})
        )

    async def stop(self) -> None:
        pass


class _Handler:
    """Decides nothing; a batch's delivery completes at once, unless it holds a record of the
    ``slow`` partition: then only when the test says so (``held``)."""

    def __init__(self, slow: int) -> None:
        self.slow = slow
        self.held: list[asyncio.Future[None]] = []

    async def __call__(
        self, messages: Sequence[RawMessage], positions: Sequence[Position]
    ) -> Awaitable[object]:
        delivery: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if any(partition == self.slow for partition, _ in positions):
            self.held.append(delivery)
        else:
            delivery.set_result(None)
        return delivery


def _lane(consumer: _FakeConsumer, handler: _Handler, handoff: Released | None = None) -> RequestLane:
    """A lane reading ``consumer`` (what ``RequestLane.start`` sets up, without a broker)."""
    lane = RequestLane(
        KafkaConnection.plaintext("unused:9092"),
        TOPIC,
        "g",
        max_in_flight=10_000,
        commit_interval_s=0.0,
        handoff_grace_s=0.0,
        handoff=handoff,
    )
    lane.attach(handler)
    lane._lock = asyncio.Lock()
    lane._send_order = asyncio.Lock()
    lane._reader.consumer = consumer
    lane._reader.task = asyncio.create_task(lane._run())
    return lane


async def _until(condition: Any, timeout_s: float = 2.0) -> None:
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout_s)


def test_a_lost_partition_is_committed_past_its_batches_in_flight_before_it_is_let_go() -> None:
    asyncio.run(_a_lost_partition_is_committed_past_its_batches_in_flight())


async def _a_lost_partition_is_committed_past_its_batches_in_flight() -> None:
    # The worker decided a batch of partition 1 whose delivery is still on its way when a
    # rebalance gives partition 1 to another worker, while partition 0 keeps it busy (so the
    # lane never waits for that delivery on its own: it keeps up to ``max_in_flight`` batches
    # awaiting delivery). The new owner must start past the batch
    # (else it decides its requests again), and the lane must not later commit a partition it
    # no longer reads (aiokafka refuses: the lane used to stop on that, deciding nothing more).
    consumer = _FakeConsumer({1: [_Record(1, 0), _Record(1, 1)]}, busy=0)
    handler = _Handler(slow=1)
    lane = _lane(consumer, handler)
    try:
        await lane.follow({0, 1})
        await _until(lambda: handler.held)
        following = asyncio.create_task(lane.follow({0}))
        await asyncio.sleep(0.1)
        assert not following.done(), "partition 1 was let go before its batch was delivered"
        handler.held[0].set_result(None)
        assert await asyncio.wait_for(following, 2.0) == {1}
        assert any(offsets.get(1) == 2 and 1 in assigned for offsets, assigned in consumer.commits)
        assert consumer.assignment() == {TopicPartition(TOPIC, 0)}
        await asyncio.sleep(0.2)  # partition 0's batches go on, and are committed
        assert lane.running
        assert all(1 in assigned for offsets, assigned in consumer.commits if 1 in offsets)
        assert max(offsets.get(0, 0) for offsets, _ in consumer.commits) > 1
    finally:
        await lane.stop()


class _Fence:
    """The hand-off fence, opened by the test: ``asked`` the partitions each call waited for."""

    def __init__(self) -> None:
        self.asked: list[set[int]] = []
        self.open = asyncio.Event()

    async def __call__(self, partitions: set[int]) -> None:
        self.asked.append(set(partitions))
        await self.open.wait()


def test_a_gained_partition_is_read_only_once_its_previous_owner_let_go() -> None:
    asyncio.run(_a_gained_partition_is_read_only_once_released())


async def _a_gained_partition_is_read_only_once_released() -> None:
    # The rebalance gives partition 1 to this worker while its old owner may still be deciding
    # its requests: not one of them is read before the fence opens, and partition 0 (kept
    # through the rebalance) is read all along.
    consumer = _FakeConsumer({}, busy=0)
    handler = _Handler(slow=-1)
    fence = _Fence()
    lane = _lane(consumer, handler, fence)
    try:
        await lane.follow({0})
        await _until(lambda: fence.asked == [{0}])  # at start too: nobody may still claim it
        fence.open.set()
        await _until(lambda: consumer.written.get(0, 0) > 2)
        fence.open.clear()
        consumer.pending[1] = [_Record(1, 0)]
        await lane.follow({0, 1})
        await _until(lambda: fence.asked == [{0}, {1}])
        read_before = consumer.written[0]
        await asyncio.sleep(0.2)
        assert 1 in consumer.pending, "a record of partition 1 was read before the fence opened"
        assert consumer.written[0] > read_before + 5  # partition 0 kept being read
        assert lane.healthy(1.0)
        fence.open.set()
        await _until(lambda: 1 not in consumer.pending)
        assert lane.partitions == {0, 1}
    finally:
        await lane.stop()


def test_a_partition_lost_while_its_fence_is_closed_is_not_read() -> None:
    asyncio.run(_a_partition_lost_while_fenced())


async def _a_partition_lost_while_fenced() -> None:
    consumer = _FakeConsumer({}, busy=0)
    fence = _Fence()
    lane = _lane(consumer, _Handler(slow=-1), fence)
    try:
        fence.open.set()
        await lane.follow({0})
        await _until(lambda: consumer.written.get(0, 0) > 2)
        fence.open.clear()
        await lane.follow({0, 1})
        await _until(lambda: len(fence.asked) == 2)
        assert lane.healthy(1.0)
        await lane.follow({0})  # another rebalance takes it away before its owner let go
        consumer.pending[1] = [_Record(1, 0)]
        fence.open.set()
        await asyncio.sleep(0.2)
        assert consumer.assignment() == {TopicPartition(TOPIC, 0)}
        assert 1 in consumer.pending
    finally:
        await lane.stop()
