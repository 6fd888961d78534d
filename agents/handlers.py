"""The scheduler's stream handlers: raw messages in -> decode -> routing service -> events out.

One class with a plain async method per input topic, so the whole streaming behaviour is
unit-testable with fakes; ``streams/binding.py`` attaches the methods to the Faust app. Every
input that cannot be decoded goes to ``tf.dlq`` with its original bytes and the reason, and the
handler goes on with the next message.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from typing import TypeVar

from agents.batch import expand_batch_job
from agents.ports import FeedbackStore, InstanceState, Publisher, Telemetry
from agents.routing import Routed, RoutingService
from schemas import topics
from schemas.codec import DecodeError, RawMessage, dead_letter, decode
from schemas.events import BatchJob, Completion, Event, Heartbeat, InferenceRequest, KvEvent, ResponseStarted

E = TypeVar("E", bound=Event)


class SchedulerAgents:
    def __init__(
        self,
        service: RoutingService,
        state: InstanceState,
        publisher: Publisher,
        store: FeedbackStore | None,
        telemetry: Telemetry,
    ) -> None:
        self.service = service
        self.state = state
        self.publisher = publisher
        self.store = store
        self.telemetry = telemetry

    # --- handlers, one per input topic --------------------------------------------------------

    async def on_requests(self, messages: Sequence[RawMessage]) -> Awaitable[object]:
        """Route one batch of raw request messages (the request lane calls this); returns the
        delivery of its decisions, which the lane awaits before committing the batch."""
        arrived = time.perf_counter()
        requests = await self._decoded(InferenceRequest, topics.REQUESTS, messages)
        routed: list[Routed] = []
        now = time.time()
        for pool, group in _by_pool(requests).items():
            routed += self.service.route(pool, group, self.state.view(pool), now)
            self.telemetry.queue_depth(pool, self.service.held(pool))
        delivered = await self._send(routed)
        self.telemetry.decided_batch(self.service.policy_name, routed, time.perf_counter() - arrived)
        if self.store is not None:
            await self.store.requests(requests)
            await self._store(routed)
        return delivered

    async def on_heartbeats(self, messages: Sequence[RawMessage]) -> None:
        """Record each heartbeat; then offer the held requests of every pool whose snapshot changed
        (a held request is routed at the first heartbeat that makes room, with no further
        request arriving)."""
        arrived = time.perf_counter()
        pools = []
        for beat in await self._decoded(Heartbeat, topics.HEARTBEATS, messages):
            self.state.record(beat)
            pools.append(beat.model)
        routed: list[Routed] = []
        now = time.time()
        for pool in dict.fromkeys(pools):
            if self.service.held(pool):
                view = self.state.view(pool)
                if view is not None:
                    routed += self.service.tick(pool, view, now)
                    self.telemetry.queue_depth(pool, self.service.held(pool))
        if routed:
            delivered = await self._send(routed)
            self.telemetry.decided_batch(self.service.policy_name, routed, time.perf_counter() - arrived)
            await delivered
            if self.store is not None:
                await self._store(routed)

    async def on_kv_events(self, messages: Sequence[RawMessage]) -> None:
        for event in await self._decoded(KvEvent, topics.KV_EVENTS, messages):
            self.service.observe_kv(event)

    async def on_first_tokens(self, messages: Sequence[RawMessage]) -> None:
        for event in await self._decoded(ResponseStarted, topics.FIRST_TOKENS, messages):
            self.service.observe_first_token(event)

    async def on_completions(self, messages: Sequence[RawMessage]) -> None:
        completions = await self._decoded(Completion, topics.COMPLETIONS, messages)
        for completion in completions:
            self.service.observe_completion(completion)
        if self.store is not None:
            await self.store.completions(completions)

    async def on_batch_jobs(self, messages: Sequence[RawMessage]) -> None:
        for job in await self._decoded(BatchJob, topics.BATCH_JOBS, messages):
            await (await self.publisher.send(topics.REQUESTS, expand_batch_job(job)))

    # --- helpers ------------------------------------------------------------------------------

    async def _decoded(
        self, kind: type[E], spec: topics.TopicSpec, messages: Sequence[RawMessage]
    ) -> list[E]:
        """Decode a batch; dead-letter (and wait for the broker to have) what does not decode."""
        good, dead = [], []
        for key, value in messages:
            try:
                good.append(decode(kind, value))
            except DecodeError as exc:
                dead.append(dead_letter(spec.name, value, key, exc.reason))
                self.telemetry.dead_lettered(spec.name)
        if dead:
            await (await self.publisher.send(topics.DLQ, dead))
        return good

    async def _send(self, routed: Sequence[Routed]) -> Awaitable[object]:
        admissions = [r.admission for r in routed]
        routings = [r.routing for r in routed if r.routing is not None]
        return asyncio.gather(
            await self.publisher.send(topics.ADMISSION, admissions),
            await self.publisher.send(topics.DECISIONS, routings),
        )

    async def _store(self, routed: Sequence[Routed]) -> None:
        assert self.store is not None
        await self.store.admissions([r.admission for r in routed])
        await self.store.routings([r.routing for r in routed if r.routing is not None])


def _by_pool(requests: Sequence[InferenceRequest]) -> dict[str, list[InferenceRequest]]:
    pools: dict[str, list[InferenceRequest]] = defaultdict(list)
    for request in requests:
        pools[request.model].append(request)
    return pools
