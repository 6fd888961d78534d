"""The fakes ``agents/ports.py`` promises: in-memory table, publisher and telemetry."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Sequence

from agents.routing import Routed
from schemas.events import (
    Event,
    FleetEvent,
)
from schemas.topics import TopicSpec
from streams.snapshot import SnapshotCache

MemoryState = SnapshotCache  # the real instance state is in memory already


class MemoryPublisher:
    def __init__(self) -> None:
        self.sent: dict[str, list[Event]] = defaultdict(list)

    async def send(self, spec: TopicSpec, events: Sequence[Event]) -> Awaitable[object]:
        self.sent[spec.name].extend(events)
        return asyncio.gather()


class RecordingTelemetry:
    def __init__(self) -> None:
        self.decided: list[Routed] = []
        self.dead: list[str] = []
        self.depth: dict[str, int] = {}
        self.fleet: list[FleetEvent] = []
        self.observed: dict[str, int] = {}

    def decided_batch(self, policy: str, outcomes: Sequence[Routed], latency_s: float) -> None:
        self.decided.extend(outcomes)

    def dead_lettered(self, topic: str) -> None:
        self.dead.append(topic)

    def queue_depth(self, pool: str, depth: int) -> None:
        self.depth[pool] = depth

    def fleet_events(self, events: Sequence[FleetEvent]) -> None:
        self.fleet.extend(events)

    def placements_observed(self, pool: str, count: int) -> None:
        self.observed[pool] = self.observed.get(pool, 0) + count
