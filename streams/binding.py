"""The short binding of the handlers to a Faust app and the worker's consumers, and the publisher.

Three readers per worker: the request lane (``streams/request_lane.py``) reads the partitions of
``tf.requests`` the deciders' group gives this worker (``streams/membership.py``); the shared log
(``streams/shared_log.py``) reads every partition of the state topics, for every decider's view;
Faust's own group consumer gives each partition of the state topics to one worker, whose
``LogKeeper`` dead-letters its messages once (in batches of up to ``batch_size`` or
``batch_window_s``), and expands batch jobs. A timer expires held requests every second. (A
fourth reader, the store's, is wired by ``worker/store.py``: ``infra/clickhouse/topic_sink.py``.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import faust

from agents.handlers import SchedulerAgents
from agents.keeping import LogKeeper
from schemas import topics
from schemas.codec import RawMessage, encode
from schemas.events import Event
from streams.app import Channels
from streams.direct import Announcer, DirectLane
from streams.membership import Membership
from streams.request_lane import RequestLane
from streams.shared_log import SharedLog


class LanePublisher:
    """``agents.ports.Publisher`` through the request lane's producer: one record batch per
    partition, handed over in call order, so decisions made on a heartbeat and on a request
    batch keep their order on ``tf.decisions``. Before the lane's producer started (during
    start-up) and after it stopped, events go through Faust's producer."""

    def __init__(self, app: faust.App, lane: RequestLane) -> None:
        self.app, self.lane = app, lane

    async def send(self, spec: topics.TopicSpec, events: Sequence[Event]) -> Awaitable[object]:
        messages = [(topics.key_of(spec, e), encode(e)) for e in events]
        if not messages:
            return asyncio.gather()
        if self.lane.sending:
            return await self.lane.send_many(spec.name, messages)
        sent = [await self.app.producer.send(spec.name, k, v, None, None, None) for k, v in messages]
        return asyncio.gather(*sent)


def bind(
    app: faust.App,
    channels: Channels,
    agents: SchedulerAgents,
    keeper: LogKeeper,
    lane: RequestLane,
    membership: Membership,
    shared: SharedLog,
    direct: DirectLane,
    batch_size: int,
    batch_window_s: float,
) -> None:
    """Attach the handlers: ``agents`` to the request lane (which reads what ``membership``
    gives this worker), to the direct lane (``direct``: gateways ask it, and learn where it is
    and what it owns from its announcements) and to the shared log (``shared``, its handlers set
    by the caller); ``keeper`` and the batch-job expansion to Faust's group consumer; a timer
    that expires held requests every second."""
    lane.attach(agents.on_requests, agents.commit_floor, agents.on_replayed_admissions)

    def batched(channel: Any, name: str, handler: Callable[[Sequence[RawMessage]], Awaitable[None]]) -> None:
        async def agent(stream: Any) -> None:
            async for batch in stream.take_events(batch_size, within=batch_window_s):
                await handler([(e.key, e.value) for e in batch])

        app.agent(channel, name=name)(agent)

    async def batch_jobs(stream: Any) -> None:
        async for event in stream.events():
            await agents.on_batch_jobs([(event.key, event.value)])

    app.agent(channels.batch_jobs, name="batch-jobs")(batch_jobs)
    batched(channels.heartbeats, "keep-heartbeats", keeper.keep_heartbeats)
    batched(channels.kv_events, "keep-kv-events", keeper.keep_kv_events)
    batched(channels.first_tokens, "keep-first-tokens", keeper.keep_first_tokens)
    batched(channels.completions, "keep-completions", keeper.keep_completions)

    @app.timer(interval=1.0)  # type: ignore[untyped-decorator]
    async def expire_held() -> None:
        await agents.on_timer()

    announcer = Announcer(
        agents.publisher.send,
        agents.service.worker,
        agents.service.scheduler,
        lambda: direct.address,
        # What the lane reads: a lost partition is announced gone only once the lane let go of
        # it (its decisions delivered), which is what the next owner waits for (streams.handoff).
        lambda: lane.partitions,
        lane.partition_count,
    )

    async def follow(partitions: set[int]) -> None:
        lost = await lane.follow(partitions)
        agents.on_partitions_revoked(lost)
        announcer.changed()

    @app.task  # type: ignore[untyped-decorator]
    async def deciding() -> None:
        await shared.start()
        await lane.start()
        await direct.start()
        await membership.start(follow)
        await announcer.start()
        try:
            await asyncio.Event().wait()  # until the worker stops and cancels this task
        finally:
            await announcer.leave()  # gateways ask the others from now on
            await direct.stop()
            await membership.stop()  # leave the group first: the others take our partitions
            await lane.stop_reading()  # (what it decided delivered and committed)
            await announcer.stop()  # and let go of them: their next owners start (streams.handoff)
            await lane.stop()
            await shared.stop()
