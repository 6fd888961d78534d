"""Every request gets one answer: the public client resends what a broker lost, the scheduler
publishes the same decision again, and the dispatcher gives the same answer again instead of a
second run (a real broker, a worker process, the emulated fleet)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from aiokafka import AIOKafkaProducer

from dispatcher.service import run_fleet
from infra.kafka.batches import collect_results
from infra.kafka.connection import KafkaConnection
from infra.kafka.request_client import RequestClient
from lab.stack import ValueCollector
from schemas.codec import encode
from schemas.events import InferenceRequest, Response, RoutingDecision
from schemas.topics import DECISIONS, REQUESTS, key_of
from sim.workloads.sources import open_workload
from tests.integration.streaming import request, unique, worker
from traffic.loadgen import publish_and_await, submit_batch

TIMEOUT_S = 60.0
POOL = "llama3-8b"  # the emulated fleet's model


def test_the_client_gets_one_answer_through_a_lost_request_and_a_lost_answer(
    broker: str, tmp_path: Path
) -> None:
    process = worker(broker, unique("answers"), tmp_path)

    async def scenario() -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        fleet = asyncio.create_task(
            run_fleet(
                KafkaConnection.plaintext(broker), "2xllama3-8b-h100", 10, 0.2, stop, unique("g"), ready=ready
            )
        )
        try:
            await asyncio.wait_for(ready.wait(), TIMEOUT_S)
            await process.wait_ready_async(90)
            async with RequestClient(
                KafkaConnection.plaintext(broker), resend_after_s=2.0, give_up_after_s=TIMEOUT_S
            ) as client:
                # Asked: answered by the dispatcher's Response.
                first = await asyncio.wait_for(client.ask(request(POOL, unique("ask"))), TIMEOUT_S)
                assert isinstance(first, Response) and first.status == "ok" and first.completion_tokens > 0

                # Published, then lost by the broker (here: never sent): the client resends it.
                lost = request(POOL, unique("lost"))
                answer = await asyncio.wait_for(client.track(lost), TIMEOUT_S)
                assert isinstance(answer, Response) and answer.request_id == lost.request_id
                assert client.resent >= 1

            # Its answer lost too: a second client resends the same request; the scheduler
            # publishes its decision again and the dispatcher the same answer, nothing runs twice.
            decisions = ValueCollector(broker, DECISIONS, POOL.encode())
            await decisions.start()
            async with RequestClient(
                KafkaConnection.plaintext(broker), resend_after_s=2.0, give_up_after_s=TIMEOUT_S
            ) as again:
                repeated = await asyncio.wait_for(again.ask(lost), TIMEOUT_S)
            assert isinstance(repeated, Response) and repeated.event_id == answer.event_id
            await asyncio.sleep(1.0)
            await decisions.stop()
            ids = {
                RoutingDecision.model_validate_json(v).event_id
                for v in decisions.values
                if lost.request_id.encode() in v
            }
            assert len(ids) == 1  # one decision, published again

            # A batch job's answers, collected (from the log, then awaited with resends).
            rows = [
                {"timestamp": i, "input_length": 700, "output_length": 8, "hash_ids": [i, 7]}
                for i in range(3)
            ]
            (tmp_path / "job.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
            job = await submit_batch(
                KafkaConnection.plaintext(broker), tmp_path / "job.jsonl", 1800.0, job_id=unique("job")
            )
            out = tmp_path / "answers.jsonl"
            assert await collect_results(
                KafkaConnection.plaintext(broker), job.job_id, out, timeout_s=TIMEOUT_S, resend_after_s=5.0
            ) == (3, 3)
            lines = [json.loads(line) for line in out.read_text().splitlines()]
            assert [line["custom_id"] for line in lines] == [
                r.request_id.split("/", 1)[1] for r in job.requests
            ]
            assert {line["status"] for line in lines} == {"ok"}

            # The load generator, awaiting its answers (tokenfleet loadgen --answers-timeout).
            trace = open_workload("synthetic:duration_s=30", seed=3)
            sent = await publish_and_await(
                KafkaConnection.plaintext(broker), trace, TIMEOUT_S, 5.0, limit=5, realtime=False, model=POOL
            )
            assert sent == (5, 5, 0)
        finally:
            stop.set()
            counts = await asyncio.wait_for(fleet, TIMEOUT_S)
        assert counts.answered_again >= 1

    try:
        asyncio.run(scenario())
    finally:
        process.stop()


def test_a_resend_while_the_request_is_held_is_not_decided_twice(broker: str, tmp_path: Path) -> None:
    """A pool with no engine: the request is held; its resends are redeliveries of a held
    request, and the only answer is the reject when the hold expires."""
    pool = unique("nobody")
    process = worker(broker, unique("held"), tmp_path, settings={"TOKENFLEET_HOLD_TIMEOUT_S": "4"})

    async def scenario() -> None:
        await process.wait_ready_async(90)
        held = InferenceRequest(request_id=unique("held"), model=pool, input_tokens=100, output_budget=8)
        producer = AIOKafkaProducer(bootstrap_servers=broker)
        await producer.start()

        async def send(request: InferenceRequest) -> None:
            await producer.send_and_wait(REQUESTS.name, encode(request), key=key_of(REQUESTS, request))

        try:
            async with RequestClient(
                KafkaConnection.plaintext(broker), resend_after_s=1.0, give_up_after_s=TIMEOUT_S, send=send
            ) as client:
                answer = await asyncio.wait_for(client.submit(held), TIMEOUT_S)
                rejected = await asyncio.wait_for(answer, TIMEOUT_S)
                assert client.resent >= 2
        finally:
            await producer.stop()
        assert rejected.request_id == held.request_id and getattr(rejected, "action", "") == "reject"

    try:
        asyncio.run(scenario())
    finally:
        process.stop()
