"""The gateway asks the decider that owns a request, directly; a decider lost before it answers
costs the call one attempt on another; no decider at all is a 503 at the decision timeout."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiokafka import TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from gateway.server import GatewayOptions
from infra.kafka.clients import LogWatch
from schemas.events import InferenceRequest
from schemas.topics import REQUESTS, key_of
from streams.direct import DirectLane
from tests.unit.gateway.fakes import FakeDecider, announce, chat_body, place, running


def test_a_decider_lost_before_it_answers_costs_one_attempt_on_another() -> None:
    async def main() -> None:
        async with running(schedule=lambda _request: None) as stack:  # the owner never answers
            other = FakeDecider(place, 0.0)
            lane = DirectLane(other, "127.0.0.1", 0)
            await lane.start()
            announce(stack.gateway.deciders, "fake:2", lane.address, partitions=(), partition_count=1)
            call = asyncio.ensure_future(stack.client.post("/v1/chat/completions", json=chat_body()))
            while not stack.gateway.requests():
                await asyncio.sleep(0.01)
            await stack.gateway.lane.stop()  # the owner dies with the call in its hands
            answer = await call
            assert answer.status == 200, await answer.text()
            (first,) = stack.gateway.requests()
            (second,) = other.asked
            assert (first.request_id, first.attempt, second.attempt) == (second.request_id, 1, 2)
            assert stack.gateway.decider.gone == [(first.model, first.request_id, 1)]  # let go there
            (ended,) = stack.gateway.completions()
            assert ended.attempt == 2 and ended.status == "ok"
            await lane.stop()

    asyncio.run(main())


def test_no_decider_answering_is_a_503_at_the_decision_timeout() -> None:
    async def main() -> None:
        options = GatewayOptions(decision_timeout_s=0.5)
        async with running(schedule=lambda _request: None, options=options) as stack:
            answer = await stack.client.post("/v1/chat/completions", json=chat_body())
            assert answer.status == 503 and "no_decision" in await answer.text()
            assert len(stack.gateway.requests()) == 1  # asked once: no resends

    asyncio.run(main())


def test_no_decider_known_is_a_503_at_the_decision_timeout() -> None:
    async def main() -> None:
        options = GatewayOptions(decision_timeout_s=0.3)
        async with running(options=options) as stack:
            await stack.gateway.lane.stop()
            announce(stack.gateway.deciders, "fake:1", stack.gateway.lane.address, leaving=True)
            answer = await stack.client.post("/v1/chat/completions", json=chat_body())
            assert answer.status == 503 and "no_decider" in await answer.text()
            assert answer.headers["Retry-After"] == "2"

    asyncio.run(main())


def test_a_call_waits_for_a_dead_decider_to_come_back_with_back_off_and_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The only decider dies (its port refuses); its worker comes back 1 s later on another
    port and announces it: the calls made meanwhile are answered, none failed; the dead
    address was tried a handful of times (back-off), and the episode logged one warning as it
    began and one as it ended, whatever the number of calls and tries."""

    async def main() -> None:
        async with running() as stack:
            gateway = stack.gateway
            dead = gateway.lane.address
            await gateway.lane.stop()
            calls = [
                asyncio.ensure_future(stack.client.post("/v1/chat/completions", json=chat_body(f"call {i}")))
                for i in range(6)
            ]
            await asyncio.sleep(1.0)
            assert not any(call.done() for call in calls)  # waiting, not failed
            unavailable = gateway.deciders.status()["deciders_unavailable"]
            assert isinstance(unavailable, dict) and unavailable[dead]["tries"] <= 12  # back-off, not a spin
            back = DirectLane(gateway.decider, "127.0.0.1", 0)
            await back.start()
            announce(gateway.deciders, "fake:1", back.address, partitions=(0,), partition_count=1)
            answers = await asyncio.gather(*calls)
            assert [a.status for a in answers] == [200] * 6
            assert all(r.attempt == 1 for r in gateway.requests())  # never sent to the dead one
            await back.stop()

    with caplog.at_level(logging.WARNING, logger="gateway.deciders"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records if r.name == "gateway.deciders"]
    assert len(said) == 2 and "failed" in said[0] and "no longer announced" in said[1], said


def test_a_decider_that_fails_is_skipped_during_its_back_off() -> None:
    """Two deciders; the owner of every partition is dead: calls go to the other at once, and
    the dead one is tried again only after its back-off, not by every call."""

    async def main() -> None:
        async with running() as stack:
            other = FakeDecider(place, 0.0)
            lane = DirectLane(other, "127.0.0.1", 0)
            await lane.start()
            deciders = stack.gateway.deciders
            dead = stack.gateway.lane.address
            await stack.gateway.lane.stop()
            announce(deciders, "fake:1", dead, partitions=(0,), partition_count=1)
            announce(deciders, "fake:2", lane.address, partitions=(), partition_count=1)
            for i in range(20):
                answer = await stack.client.post("/v1/chat/completions", json=chat_body(f"call {i}"))
                assert answer.status == 200
            assert len(other.asked) == 20
            unavailable = deciders.status()["deciders_unavailable"]
            assert isinstance(unavailable, dict) and 1 <= unavailable[dead]["tries"] <= 5
            await lane.stop()

    asyncio.run(main())


def test_ready_only_while_a_live_decider_is_known() -> None:
    async def main() -> None:
        async with running() as stack:
            deciders = stack.gateway.deciders
            deciders._watch = LogWatch(_AnsweredConsumer(), "test")  # the reader is current
            await deciders._watch.check()
            assert deciders.ready
            address = stack.gateway.lane.address
            deciders._failed(address, "connection refused")  # it died: no way to a decision
            assert not deciders.ready
            await asyncio.sleep(0.01)
            announce(deciders, "fake:1", address, partitions=(0,), partition_count=1)  # back
            request = InferenceRequest(request_id="r", model="m", input_tokens=10, output_budget=4)
            assert deciders.ready and deciders._choose(request)[0] == address  # asked at once
            announce(deciders, "fake:1", address, leaving=True)
            assert not deciders.ready
            answer = await stack.client.get("/ready")
            body = await answer.json()
            assert answer.status == 503 and body["deciders_live"] == 0

    asyncio.run(main())


class _AnsweredConsumer:
    """A consumer whose one partition was just fetched, at its end."""

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("tf.deciders", 0)}

    def last_poll_timestamp(self, _tp: TopicPartition) -> int:
        return 1

    def highwater(self, _tp: TopicPartition) -> int:
        return 5

    async def position(self, _tp: TopicPartition) -> int:
        return 5


def test_each_request_is_asked_of_the_owner_of_its_partition() -> None:
    async def main() -> None:
        async with running() as stack:
            other = FakeDecider(place, 0.0)
            lane = DirectLane(other, "127.0.0.1", 0)
            await lane.start()
            deciders = stack.gateway.deciders
            announce(deciders, "fake:1", stack.gateway.lane.address, partitions=(0, 2), partition_count=4)
            announce(deciders, "fake:2", lane.address, partitions=(1, 3), partition_count=4)
            texts = [f"conversation {i} " * 300 for i in range(12)]  # different prefixes
            for text in texts:
                answer = await stack.client.post("/v1/chat/completions", json=chat_body(text))
                assert answer.status == 200
            partitioner = DefaultPartitioner()
            for decider, owned in ((stack.gateway.decider, {0, 2}), (other, {1, 3})):
                for request in decider.asked:
                    assert partitioner(key_of(REQUESTS, request), [0, 1, 2, 3], [0, 1, 2, 3]) in owned
            assert len(stack.gateway.requests()) + len(other.asked) == len(texts)
            assert stack.gateway.requests() and other.asked  # both owners were asked
            await lane.stop()

    asyncio.run(main())
