"""A request asked for directly (a gateway's, ``streams/direct.py``) is decided at once, like one
read from the log, recorded on the log marked ``decided_by``, and never decided a second time:
not when the lane reads that record, not when it is asked again."""

from __future__ import annotations

import asyncio

import pytest

from agents.handlers import Refused, SchedulerAgents
from agents.policy.pools import HoldLimits
from agents.routing import RoutingService
from schemas import topics
from schemas.codec import encode
from schemas.events import AdmissionDecision, InferenceRequest, RoutingDecision
from tests.functional.fakes import MemoryPublisher, MemoryState, RecordingTelemetry
from tests.functional.test_agents import beat, raw, request


def make(hold: HoldLimits | None = None) -> tuple[SchedulerAgents, MemoryPublisher]:
    publisher = MemoryPublisher()
    service = RoutingService("round-robin", worker="w1", hold=hold or HoldLimits())
    return SchedulerAgents(service, MemoryState(), publisher, RecordingTelemetry()), publisher


def sent(publisher: MemoryPublisher, spec: topics.TopicSpec) -> list:  # type: ignore[type-arg]
    return list(publisher.sent.get(spec.name, []))  # type: ignore[attr-defined]


def test_a_direct_request_is_placed_at_once_and_recorded_once() -> None:
    async def main() -> None:
        agents, publisher = make()
        await agents.on_heartbeats(raw(beat("m", "i-1")))
        key, answer = await agents.on_direct(encode(request("m", "r1", reply="http")))
        assert key == ("m", "r1", 1) and answer.done()
        placed = answer.result()
        assert isinstance(placed, RoutingDecision) and placed.instance_id == "i-1"
        await asyncio.sleep(0)
        (record,) = sent(publisher, topics.REQUESTS)
        assert record.request_id == "r1" and record.decided_by == "w1"
        assert [d.event_id for d in sent(publisher, topics.DECISIONS)] == [placed.event_id]
        # The lane reads the record later: not decided again.
        await (await agents.on_requests(raw(record), [(0, 0)]))
        assert len(sent(publisher, topics.DECISIONS)) == 1
        assert len(sent(publisher, topics.ADMISSION)) == 1
        # Asked again (its gateway lost the answer): the answer it had, not a second decision.
        _, again = await agents.on_direct(encode(request("m", "r1", reply="http")))
        assert again.result().event_id == placed.event_id
        assert len(sent(publisher, topics.DECISIONS)) == 1

    asyncio.run(main())


def test_a_held_direct_request_is_answered_when_a_heartbeat_makes_room() -> None:
    async def main() -> None:
        agents, _ = make()
        _, answer = await agents.on_direct(encode(request("m", "r1")))
        assert not answer.done()  # no instance yet: held
        await agents.on_heartbeats(raw(beat("m", "i-1")))
        assert isinstance(answer.result(), RoutingDecision)

    asyncio.run(main())


def test_a_held_direct_request_that_expires_is_answered_with_the_reject() -> None:
    async def main() -> None:
        agents, _ = make(HoldLimits(timeout_s=0.0))
        _, answer = await agents.on_direct(encode(request("m", "r1")))
        await agents.on_timer()
        rejected = answer.result()
        assert isinstance(rejected, AdmissionDecision) and rejected.action == "reject"

    asyncio.run(main())


def test_a_held_direct_request_whose_gateway_left_is_let_go() -> None:
    async def main() -> None:
        agents, publisher = make()
        key, answer = await agents.on_direct(encode(request("m", "r1")))
        agents.on_direct_gone(key)
        assert answer.cancelled() and agents.service.held("m") == 0
        await agents.on_heartbeats(raw(beat("m", "i-1")))
        assert sent(publisher, topics.DECISIONS) == []  # nobody to run it: never placed

    asyncio.run(main())


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (b"{not json", ("", 0)),
        (b'{"request_id": "r9", "attempt": 3, "model": "m"}', ("r9", 3)),
    ],
)
def test_what_is_not_a_request_is_refused_and_dead_lettered(value: bytes, named: tuple[str, int]) -> None:
    async def main() -> None:
        agents, publisher = make()
        with pytest.raises(Refused) as refused:
            await agents.on_direct(value)
        assert (refused.value.request_id, refused.value.attempt) == named
        (dead,) = sent(publisher, topics.DLQ)
        assert dead.source_topic == topics.REQUESTS.name and str(refused.value) == dead.reason

    asyncio.run(main())


def test_a_request_without_a_count_is_refused_with_the_reason() -> None:
    async def main() -> None:
        agents, _ = make()
        uncounted = InferenceRequest(request_id="r2", model="m", prompt="hello", output_budget=4)
        with pytest.raises(Refused, match="not counted"):
            await agents.on_direct(encode(uncounted))

    asyncio.run(main())
