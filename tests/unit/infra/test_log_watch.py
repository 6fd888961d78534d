"""A reader notices a log that starts again (a restarted in-memory broker, a recreated topic)
and reads the new log from its start, instead of waiting for it to reach the old position."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka import TopicPartition

from infra.kafka.clients import LogWatch

A, B = TopicPartition("tf.deciders", 0), TopicPartition("tf.deciders", 1)


class FakeReader:
    """What ``LogWatch`` reads of a consumer: positions, the last fetch's high watermarks."""

    def __init__(self, positions: dict[TopicPartition, int], marks: dict[TopicPartition, int | None]) -> None:
        self.positions, self.marks = positions, marks
        self.polls = 0
        self.seeks: list[TopicPartition] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.positions)

    def last_poll_timestamp(self, _tp: TopicPartition) -> int:
        return self.polls

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.marks[tp]

    async def position(self, tp: TopicPartition) -> int:
        return self.positions[tp]

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self.seeks.extend(partitions)
        for tp in partitions:
            self.positions[tp] = 0


def test_a_position_beyond_the_end_is_a_log_that_started_again(caplog: pytest.LogCaptureFixture) -> None:
    reader = FakeReader({A: 120, B: 20}, {A: 120, B: 40})  # B's reader is behind
    watch = LogWatch(reader, "test reader")

    async def main() -> None:
        assert await watch.check() == []
        reader.marks = {A: 3, B: 30}  # the broker restarted; B's new log already passed 20
        with caplog.at_level(logging.WARNING):
            assert await watch.check() == [A, B]  # B's watermark fell below one seen before
        assert reader.seeks == [A, B] and reader.positions == {A: 0, B: 0}
        reader.positions = {A: 3, B: 30}
        assert await watch.check() == []  # reading the new log: nothing to notice

    asyncio.run(main())
    (line,) = [r.getMessage() for r in caplog.records]
    assert "test reader" in line and "tf.deciders:0" in line and "started again" in line
    assert watch.restarts == 2


def test_a_partition_not_fetched_yet_is_left_alone_and_freshness_follows_the_fetches() -> None:
    reader = FakeReader({A: 7}, {A: None})
    watch = LogWatch(reader, "test reader")

    async def main() -> None:
        assert not watch.fresh(5.0)
        reader.polls = 0
        assert await watch.check() == []
        reader.polls = 1  # a fetch was answered
        await watch.check()
        assert watch.fresh(5.0) and not watch.fresh(-1.0)

    asyncio.run(main())
