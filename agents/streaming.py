"""The Faust agents: decode -> call the routing service / policy -> send events, update tables.

Each agent is thin: the work is in ``agents.routing``, ``agents.batch`` and ``streams``. Every
input that cannot be decoded goes to ``tf.dlq`` with its original bytes and the reason, and the
agent goes on with the next message.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any, TypeVar

import faust

from agents.batch import expand_batch_job
from agents.ports import FeedbackStore, Telemetry
from agents.routing import Router
from schemas import topics
from schemas.codec import DecodeError, dead_letter, decode, encode
from schemas.events import BatchJob, Completion, Event, Heartbeat, InferenceRequest, KvEvent
from streams.app import Channels
from streams.request_lane import RawMessage, RequestLane

E = TypeVar("E", bound=Event)


def register_agents(
    app: faust.App,
    bootstrap: str,
    channels: Channels,
    router: Router,
    store: FeedbackStore | None,
    telemetry: Telemetry,
    batch_size: int = 512,
    batch_window_s: float = 0.05,
    request_fetch_max_wait_ms: int = 10,
    request_batch_max: int = 256,
) -> None:
    """Attach the scheduler's agents to ``app``."""

    async def publish(spec: topics.TopicSpec, events: Iterable[Event]) -> None:
        """Send events to ``spec``'s topic, keyed per the spec; return when the broker has them."""
        pending = [
            await app.producer.send(spec.name, topics.key_of(spec, e), encode(e), None, None, None)
            for e in events
        ]
        await asyncio.gather(*pending)

    async def decoded(kind: type[E], spec: topics.TopicSpec, batch: Sequence[Any]) -> list[E]:
        """Decode a batch of Faust events; dead-letter the ones that do not decode."""
        good, dead = [], []
        for event in batch:
            try:
                good.append(decode(kind, event.value))
            except DecodeError as exc:
                dead.append(dead_letter(spec.name, event.value, event.key, exc.reason))
                telemetry.dead_lettered(spec.name)
        await publish(topics.DLQ, dead)
        return good

    @app.agent(channels.heartbeats, name="instance-state")
    async def instance_state(stream: Any) -> None:
        # One event at a time: table writes need the current event (its partition).
        async for event in stream.events():
            for beat in await decoded(Heartbeat, topics.HEARTBEATS, [event]):
                states = dict(channels.instance_state[beat.model])
                states[beat.instance_id] = beat.model_dump(mode="json")
                channels.instance_state[beat.model] = states

    @app.agent(channels.kv_events, name="prefix-index")
    async def prefix_index(stream: Any) -> None:
        async for batch in stream.take_events(batch_size, within=batch_window_s):
            for kv in await decoded(KvEvent, topics.KV_EVENTS, batch):
                router.observe_kv(kv)

    async def route(messages: Sequence[RawMessage]) -> Awaitable[object]:
        """Route one batch of raw request messages (called by the request lane); returns the
        delivery of its decisions, which the lane awaits before committing the batch."""
        arrived = time.perf_counter()
        requests = await decoded(InferenceRequest, topics.REQUESTS, [_Raw(k, v) for k, v in messages])
        outcomes = []
        for pool, group in _by_pool(requests).items():
            outcomes += router.route(group, channels.instance_state.get(pool, {}), time.time())
            telemetry.queue_depth(pool, router.held())
        admissions = [o.admission for o in outcomes]
        routings = [o.routing for o in outcomes if o.routing is not None]
        delivered = asyncio.gather(
            await lane.send_many(
                topics.ADMISSION.name, [(topics.key_of(topics.ADMISSION, e), encode(e)) for e in admissions]
            ),
            await lane.send_many(
                topics.DECISIONS.name, [(topics.key_of(topics.DECISIONS, e), encode(e)) for e in routings]
            ),
        )
        telemetry.decided_batch(router.policy_name, outcomes, time.perf_counter() - arrived)
        if store is not None:
            await store.requests(requests)
            await store.admissions(admissions)
            await store.routings(routings)
        return delivered

    lane = RequestLane(
        bootstrap,
        topics.REQUESTS.name,
        follows_topic=topics.HEARTBEATS.name,
        group_id=f"{app.conf.id}-requests",
        handler=route,
        fetch_max_wait_ms=request_fetch_max_wait_ms,
        max_batch=request_batch_max,
    )

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]
    async def follow_assignment(sender: Any, *args: Any, **kwargs: Any) -> None:
        await lane.on_assigned(args[0])  # the assigned TopicPartitions

    @app.on_partitions_revoked.connect  # type: ignore[arg-type]
    async def follow_revocation(sender: Any, *args: Any, **kwargs: Any) -> None:
        await lane.on_revoked(args[0])  # the revoked TopicPartitions

    @app.task  # type: ignore[untyped-decorator]
    async def request_lane() -> None:
        await lane.start()
        try:
            await asyncio.Event().wait()  # until the worker stops and cancels this task
        finally:
            await lane.stop()

    @app.agent(channels.completions, name="feedback")
    async def feedback(stream: Any) -> None:
        async for batch in stream.take_events(batch_size, within=batch_window_s):
            completions = await decoded(Completion, topics.COMPLETIONS, batch)
            for completion in completions:
                router.observe_completion(completion)
            if store is not None:
                await store.completions(completions)

    @app.agent(channels.batch_jobs, name="batch-jobs")
    async def batch_jobs(stream: Any) -> None:
        async for event in stream.events():
            for job in await decoded(BatchJob, topics.BATCH_JOBS, [event]):
                await publish(topics.REQUESTS, expand_batch_job(job))


class _Raw:
    """A raw message with the two attributes ``decoded`` reads (like a Faust event)."""

    __slots__ = ("key", "value")

    def __init__(self, key: bytes | None, value: bytes | None) -> None:
        self.key, self.value = key, value


def _by_pool(requests: Sequence[InferenceRequest]) -> dict[str, list[InferenceRequest]]:
    pools: dict[str, list[InferenceRequest]] = defaultdict(list)
    for request in requests:
        pools[request.model].append(request)
    return pools
