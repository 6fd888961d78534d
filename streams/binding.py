"""The short binding of ``agents.handlers.SchedulerAgents`` to a Faust app, and the publisher.

Heartbeats are handled one event at a time (a table write needs its event's partition); KV
events, first tokens and completions in batches of up to ``batch_size`` or ``batch_window_s``;
requests by the request lane (``streams/request_lane.py``), which follows Faust's assignment of
``tf.heartbeats`` so the worker that owns a pool's state routes its requests; a timer expires
held requests every second.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import faust

from agents.handlers import SchedulerAgents
from schemas import topics
from schemas.codec import RawMessage, encode
from schemas.events import Event
from streams.app import Channels
from streams.request_lane import RequestLane
from streams.snapshot import SnapshotCache


class LanePublisher:
    """``agents.ports.Publisher`` through the request lane's producer: one record batch per
    partition, handed over in call order, so decisions made on a heartbeat and on a request
    batch keep their order on ``tf.decisions``. Before the lane has started (during start-up)
    events go through Faust's producer."""

    def __init__(self, app: faust.App, lane: RequestLane) -> None:
        self.app, self.lane = app, lane

    async def send(self, spec: topics.TopicSpec, events: Sequence[Event]) -> Awaitable[object]:
        messages = [(topics.key_of(spec, e), encode(e)) for e in events]
        if not messages:
            return asyncio.gather()
        if self.lane.running:
            return await self.lane.send_many(spec.name, messages)
        sent = [await self.app.producer.send(spec.name, k, v, None, None, None) for k, v in messages]
        return asyncio.gather(*sent)


def bind(
    app: faust.App,
    channels: Channels,
    agents: SchedulerAgents,
    lane: RequestLane,
    cache: SnapshotCache,
    batch_size: int,
    batch_window_s: float,
) -> None:
    """Attach every handler of ``agents`` to ``app`` and to the request lane (and the lane to the
    app's partition assignment)."""
    lane.attach(agents.on_requests, agents.commit_floor, agents.on_replayed_admissions)

    def batched(channel: Any, name: str, handler: Callable[[Sequence[RawMessage]], Awaitable[None]]) -> None:
        async def agent(stream: Any) -> None:
            async for batch in stream.take_events(batch_size, within=batch_window_s):
                await handler([(e.key, e.value) for e in batch])

        app.agent(channel, name=name)(agent)

    async def instance_state(stream: Any) -> None:
        async for event in stream.events():
            await agents.on_heartbeats([(event.key, event.value)])

    async def batch_jobs(stream: Any) -> None:
        async for event in stream.events():
            await agents.on_batch_jobs([(event.key, event.value)])

    app.agent(channels.heartbeats, name="instance-state")(instance_state)
    app.agent(channels.batch_jobs, name="batch-jobs")(batch_jobs)
    batched(channels.kv_events, "prefix-index", agents.on_kv_events)
    batched(channels.first_tokens, "first-tokens", agents.on_first_tokens)
    batched(channels.completions, "feedback", agents.on_completions)

    @app.timer(interval=1.0)  # type: ignore[untyped-decorator]
    async def expire_held() -> None:
        await agents.on_timer()

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def follow_assignment(sender: Any, *args: Any, **kwargs: Any) -> None:
        cache.clear()  # the recovered table is the truth for the pools now owned
        await lane.on_assigned(args[0])  # the assigned TopicPartitions

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def follow_revocation(sender: Any, *args: Any, **kwargs: Any) -> None:
        revoked = args[0]  # the revoked TopicPartitions
        await lane.on_revoked(revoked)
        agents.on_partitions_revoked({tp.partition for tp in revoked if tp.topic == topics.HEARTBEATS.name})

    @app.task  # type: ignore[untyped-decorator]
    async def request_lane() -> None:
        await lane.start()
        try:
            await asyncio.Event().wait()  # until the worker stops and cancels this task
        finally:
            await lane.stop()
