"""The fakes ``agents/ports.py`` promises: in-memory table, publisher, store and telemetry."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Sequence
from typing import Any

from agents.policy.types import ClusterView
from agents.routing import Routed
from schemas.events import (
    AdmissionDecision,
    Completion,
    Event,
    FleetEvent,
    Heartbeat,
    InferenceRequest,
    RoutingDecision,
)
from schemas.topics import TopicSpec
from streams.snapshot import SnapshotCache


class MemoryState:
    """``InstanceState`` over a dict table and the real snapshot cache."""

    def __init__(self) -> None:
        self.table: dict[str, dict[str, Any]] = defaultdict(dict)
        self.cache = SnapshotCache()

    def record(self, beat: Heartbeat) -> None:
        self.table[beat.model][beat.instance_id] = beat.model_dump(mode="json")
        self.cache.update(beat)

    def view(self, pool: str) -> ClusterView | None:
        return self.cache.view(pool, lambda p: self.table.get(p, {}))


class MemoryPublisher:
    def __init__(self) -> None:
        self.sent: dict[str, list[Event]] = defaultdict(list)

    async def send(self, spec: TopicSpec, events: Sequence[Event]) -> Awaitable[object]:
        self.sent[spec.name].extend(events)
        return asyncio.gather()


class MemoryStore:
    def __init__(self) -> None:
        self.rows: dict[str, list[Event]] = defaultdict(list)

    async def requests(self, events: Sequence[InferenceRequest]) -> None:
        self.rows["requests"].extend(events)

    async def admissions(self, events: Sequence[AdmissionDecision]) -> None:
        self.rows["admissions"].extend(events)

    async def routings(self, events: Sequence[RoutingDecision]) -> None:
        self.rows["routings"].extend(events)

    async def completions(self, events: Sequence[Completion]) -> None:
        self.rows["completions"].extend(events)

    async def fleet_events(self, events: Sequence[FleetEvent]) -> None:
        self.rows["fleet_events"].extend(events)

    async def heartbeats(self, events: Sequence[Heartbeat]) -> None:
        self.rows["heartbeats"].extend(events)


class RecordingTelemetry:
    def __init__(self) -> None:
        self.decided: list[Routed] = []
        self.dead: list[str] = []
        self.depth: dict[str, int] = {}
        self.fleet: list[FleetEvent] = []

    def decided_batch(self, policy: str, outcomes: Sequence[Routed], latency_s: float) -> None:
        self.decided.extend(outcomes)

    def dead_lettered(self, topic: str) -> None:
        self.dead.append(topic)

    def queue_depth(self, pool: str, depth: int) -> None:
        self.depth[pool] = depth

    def fleet_events(self, events: Sequence[FleetEvent]) -> None:
        self.fleet.extend(events)
