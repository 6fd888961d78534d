"""Membership of the deciders' consumer group: which partitions of ``tf.requests`` are this
worker's.

Kafka's consumer group is the distributed engine: every worker joins the group
``<app id>-deciders`` subscribed to ``tf.requests``, the broker's coordinator notices a worker
that joins or dies (its session times out), and the group's leader spreads the partitions with
the sticky assignor, so a rebalance moves only the partitions that must move. This consumer
never reads a record (its partitions stay paused): it only tells the request lane what to read.

Why not read with it: under Kafka's eager protocol every rebalance first revokes every
partition, and a consumer reads nothing until the new assignment arrives (about half the
rebalance timeout on the embedded broker). The lane reads its partitions on a consumer of its
own, so a survivor goes on routing what it owns while the group rebalances, and changes what it
reads only when the new assignment names other partitions (``on_assigned``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

from streams.clients import ConsumerLoop
from streams.connection import BrokerConnection

log = logging.getLogger(__name__)

Assigned = Callable[[set[int]], Awaitable[None]]
"""Called with the full set of partitions this worker now owns, after each rebalance."""


class Membership(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(
        self,
        connection: BrokerConnection,
        topic: str,
        group_id: str,
        *,
        session_timeout_s: float,
        rebalance_timeout_s: float,
        heartbeat_interval_s: float,
    ) -> None:
        self.topic, self.group_id = topic, group_id
        self.on_assigned: Assigned | None = None
        self.partitions: set[int] = set()
        self.rebalancing_since: float | None = time.monotonic()  # monotonic; None = settled
        self._reader = ConsumerLoop(
            "deciders' group",
            {
                **connection.client_options(),
                "group_id": group_id,
                "enable_auto_commit": False,
                "partition_assignment_strategy": (StickyPartitionAssignor,),
                "session_timeout_ms": int(session_timeout_s * 1000),
                "rebalance_timeout_ms": int(rebalance_timeout_s * 1000),
                "heartbeat_interval_ms": int(heartbeat_interval_s * 1000),
            },
        )

    async def start(self, on_assigned: Assigned) -> None:
        self.on_assigned = on_assigned
        await self._reader.start(self._poll, topics=[self.topic], listener=self)

    def settled_for(self) -> float:
        """How long the group has been without an assignment for this worker (0 once settled)."""
        since = self.rebalancing_since
        return 0.0 if since is None else time.monotonic() - since

    async def _poll(self) -> None:
        """Stay a member: a consumer that does not poll leaves the group after
        ``max_poll_interval_ms``; every partition is paused, so a poll returns nothing."""
        while True:
            try:
                await self._reader.consumer.getmany(timeout_ms=1000)
            except Exception:  # the coordinator reconnects by itself; keep polling
                log.exception("deciders' group: poll failed")
                await asyncio.sleep(1.0)

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        """The eager protocol revokes everything before each rebalance: nothing to do yet (the
        lane goes on reading until the new assignment says otherwise)."""
        if self.rebalancing_since is None:
            self.rebalancing_since = time.monotonic()

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self._reader.consumer.pause(*assigned)
        self.partitions = {tp.partition for tp in assigned if tp.topic == self.topic}
        self.rebalancing_since = None
        log.info(
            "deciders' group %s: this worker owns %s partitions %s",
            self.group_id,
            self.topic,
            sorted(self.partitions),
        )
        if self.on_assigned is not None:
            await self.on_assigned(set(self.partitions))

    async def stop(self) -> None:
        await self._reader.stop()  # leaves the group: the others rebalance at once
