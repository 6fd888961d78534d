"""FleetMind in the streaming handlers: a DC whose heartbeats stop loses its traffic, and the
``dc_down`` it noticed is published on ``tf.fleet-events`` and counted (the store reads it from the topic)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agents.handlers import SchedulerAgents
from agents.routing import RoutingService
from schemas import topics
from schemas.codec import encode
from schemas.events import FleetEvent, Heartbeat, InferenceRequest, RoutingDecision
from tests.functional.fakes import MemoryPublisher, MemoryState, RecordingTelemetry

HEARTBEAT_S = 0.2  # an instance silent for 0.4 s is out of capacity


def beat(instance: str, dc: str) -> Heartbeat:
    return Heartbeat(
        instance_id=instance, dc=dc, model="m", model_version="1", profile="llama3-8b-h100",
        waiting=0, running=0, tokens_in_flight=0, kv_blocks_used=0, kv_blocks_total=1000,
    )  # fmt: skip


def ask(rid: str) -> InferenceRequest:
    return InferenceRequest(request_id=rid, model="m", input_tokens=600, output_budget=16, home_dc="dc-a")


def raw(*events: Any) -> list[tuple[bytes | None, bytes | None]]:
    return [(b"m", encode(e)) for e in events]


def test_a_dc_whose_heartbeats_stop_loses_its_requests_and_is_reported_down() -> None:
    publisher, telemetry = MemoryPublisher(), RecordingTelemetry()
    service = RoutingService(
        "fleetmind+least-tokens", params={"fleetmind": {"heartbeat_s": HEARTBEAT_S}}, worker="w-1"
    )
    agents = SchedulerAgents(service, MemoryState(), publisher, telemetry)

    async def scenario() -> None:
        last_a = beat("a-1", "dc-a")
        await agents.on_heartbeats(raw(last_a, beat("b-1", "dc-b")))
        await agents.on_requests(raw(ask("while-a-beats")))
        # dc-a's heartbeats stop; dc-b's go on
        await asyncio.sleep(max(last_a.ts + 2 * HEARTBEAT_S + 0.05 - time.time(), 0.0))
        await agents.on_heartbeats(raw(beat("b-1", "dc-b")))
        await agents.on_requests(raw(ask("after-a-stopped")))
        await agents.on_timer()  # nothing new to tell: nothing published twice

    asyncio.run(scenario())
    decisions = publisher.sent[topics.DECISIONS.name]
    assert all(isinstance(d, RoutingDecision) for d in decisions)
    placed = {d.request_id: (d.dc, d.instance_id) for d in decisions}  # type: ignore[attr-defined]
    assert placed == {"while-a-beats": ("dc-a", "a-1"), "after-a-stopped": ("dc-b", "b-1")}

    (down,) = publisher.sent[topics.FLEET_EVENTS.name]
    assert isinstance(down, FleetEvent)
    assert (down.kind, down.dc, down.model, down.worker) == ("dc_down", "dc-a", "m", "w-1")
    assert down.detail == "0 of 1 instances ready with a fresh heartbeat"
    assert telemetry.fleet == [down]


def test_the_timer_notices_a_dc_that_went_quiet_without_any_request() -> None:
    publisher = MemoryPublisher()
    service = RoutingService("fleetmind+least-tokens", params={"fleetmind": {"heartbeat_s": HEARTBEAT_S}})
    agents = SchedulerAgents(service, MemoryState(), publisher, RecordingTelemetry())

    async def scenario() -> None:
        last_a = beat("a-1", "dc-a")
        await agents.on_heartbeats(raw(last_a, beat("b-1", "dc-b")))
        await agents.on_requests(raw(ask("first")))  # the pool's scheduler exists from here
        await agents.on_timer()
        assert topics.FLEET_EVENTS.name not in publisher.sent  # both DCs beat: nothing to tell
        await asyncio.sleep(max(last_a.ts + 2 * HEARTBEAT_S + 0.05 - time.time(), 0.0))
        await agents.on_heartbeats(raw(beat("b-1", "dc-b")))  # dc-b beats on; nothing is held
        await agents.on_timer()  # no request: only the timer looks

    asyncio.run(scenario())
    (down,) = publisher.sent[topics.FLEET_EVENTS.name]
    assert isinstance(down, FleetEvent) and (down.kind, down.dc) == ("dc_down", "dc-a")
