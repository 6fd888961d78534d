"""The gateway asks the decider that owns a request, directly; a decider lost before it answers
costs the call one attempt on another; no decider at all is a 503 at the decision timeout."""

from __future__ import annotations

import asyncio

from aiokafka.partitioner import DefaultPartitioner

from gateway.server import GatewayOptions
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
            assert answer.status == 503 and "no_decision" in await answer.text()

    asyncio.run(main())


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
