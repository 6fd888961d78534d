"""The emulated fleet and the load generator against the real embedded broker (Tansu)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from dispatcher.service import run_fleet
from infra.kafka.connection import KafkaConnection
from schemas.codec import DecodeError, decode, encode
from schemas.events import (
    BatchJob,
    Completion,
    Event,
    Heartbeat,
    InferenceRequest,
    ResponseStarted,
    RoutingDecision,
)
from schemas.topics import BATCH_JOBS, COMPLETIONS, DECISIONS, FIRST_TOKENS, HEARTBEATS, REQUESTS, key_of
from sim.workloads.sources import open_workload
from traffic.loadgen import parse_duration, publish_workload, submit_batch

TIMEOUT_S = 30.0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


async def collect(
    bootstrap: str,
    topics: list[str],
    parse: Callable[[str, bytes], Event | None],
    done: Callable[[list[Event]], bool],
) -> list[Event]:
    """Read ``topics`` from the beginning (no consumer group: no join wait) until ``done``."""
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    found: list[Event] = []
    try:
        while not done(found):
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for record in records:
                    event = parse(record.topic, record.value)
                    if event is not None:
                        found.append(event)
        return found
    finally:
        await consumer.stop()


def a_decision(rid: str, model: str = "llama3-8b") -> RoutingDecision:
    request = InferenceRequest(
        request_id=rid,
        model=model,
        prompt_block_hashes=(11, 12),
        input_tokens=1200,
        output_budget=40,  # no lengths given to the fleet: it generates the whole budget
        slo_class="interactive",
    )
    return RoutingDecision(
        request_id=rid,
        model=model,
        slo_class="interactive",
        dc="dc-1",
        instance_id="i001",
        policy="test",
        decision_latency_s=0.0,
        request=request,
    )


def test_the_fleet_executes_a_decision_and_reports_it(broker: str) -> None:
    rid = unique("fleet")
    started = time.time()

    def parse(topic: str, value: bytes) -> Event | None:
        if topic == COMPLETIONS.name:
            completion = Completion.model_validate_json(value)
            return completion if completion.request_id == rid else None
        if topic == FIRST_TOKENS.name:
            first = ResponseStarted.model_validate_json(value)
            return first if first.request_id == rid else None
        beat = Heartbeat.model_validate_json(value)
        return beat if beat.ts >= started else None

    def seen_all(events: list[Event]) -> bool:
        return all(
            any(isinstance(e, kind) for e in events) for kind in (ResponseStarted, Completion, Heartbeat)
        )

    topics = [FIRST_TOKENS.name, COMPLETIONS.name, HEARTBEATS.name]

    async def scenario() -> None:
        stop, ready = asyncio.Event(), asyncio.Event()
        fleet = asyncio.create_task(
            run_fleet(
                KafkaConnection.plaintext(broker), "2xllama3-8b-h100", 10, 0.2, stop, unique("g"), ready=ready
            )
        )
        try:
            # At speed 10 the group join (seconds) would cost the request its client timeout.
            await asyncio.wait_for(ready.wait(), TIMEOUT_S)
            producer = AIOKafkaProducer(bootstrap_servers=broker)
            await producer.start()
            try:
                await producer.send_and_wait(DECISIONS.name, b"{not json", key=b"llama3-8b")
                decision = a_decision(rid)
                await producer.send_and_wait(
                    DECISIONS.name, encode(decision), key=key_of(DECISIONS, decision)
                )
            finally:
                await producer.stop()
            events = await asyncio.wait_for(collect(broker, topics, parse, seen_all), TIMEOUT_S)
            await asyncio.sleep(0.5)  # no second completion for the same request
            stop.set()
            counts = await asyncio.wait_for(fleet, TIMEOUT_S)
        finally:
            stop.set()
            if not fleet.done():
                fleet.cancel()
        assert counts.decisions >= 1 and counts.invalid >= 1 and counts.completions >= 1
        assert counts.first_tokens >= 1 and counts.heartbeats >= 2  # one per instance per beat
        events = await asyncio.wait_for(collect(broker, topics, parse, seen_all), TIMEOUT_S)
        [completion] = [e for e in events if isinstance(e, Completion)]
        assert (completion.status, completion.instance_id, completion.output_tokens) == ("ok", "i001", 40)
        assert completion.model == "llama3-8b" and completion.ttft_s is not None
        [first] = [e for e in events if isinstance(e, ResponseStarted)]  # once, on its own topic
        assert (first.instance_id, first.model, first.attempt) == ("i001", "llama3-8b", 1)
        assert first.ttft_s == pytest.approx(completion.ttft_s) and first.ts <= completion.ts
        beats = [e for e in events if isinstance(e, Heartbeat)]
        assert {b.instance_id for b in beats} <= {"i000", "i001"} and beats[0].kv_blocks_total > 0

    asyncio.run(scenario())


def test_loadgen_publishes_valid_requests_keyed_by_model(broker: str) -> None:
    model = unique("model")
    workload = open_workload("synthetic:duration_s=120,rate_per_s=2", seed=5)

    def parse(topic: str, value: bytes) -> Event | None:
        try:  # the session's broker also carries other tests' (some deliberately invalid) requests
            request = decode(InferenceRequest, value)
        except DecodeError:
            return None
        return request if request.model == model else None

    async def scenario() -> list[Event]:
        sent = await asyncio.wait_for(
            publish_workload(
                KafkaConnection.plaintext(broker), workload, model=model, limit=20, realtime=False
            ),
            TIMEOUT_S,
        )
        assert sent == 20
        return await asyncio.wait_for(
            collect(broker, [REQUESTS.name], parse, lambda found: len(found) >= 20), TIMEOUT_S
        )

    requests = [e for e in asyncio.run(scenario()) if isinstance(e, InferenceRequest)]
    expected = workload.requests[:20]
    assert sorted(r.request_id for r in requests) == sorted(t.request_id for t in expected)
    by_id = {r.request_id: r for r in requests}
    for trace in expected:
        request = by_id[trace.request_id]
        assert request.prompt_block_hashes == trace.block_hashes
        assert "true_output_tokens" not in request.model_dump()  # the length never travels
        assert request.input_tokens == trace.input_tokens and request.slo_class == trace.slo_class
        assert (request.deadline_ts is None) == (trace.deadline_s is None)


def test_loadgen_paces_requests_in_real_time(broker: str) -> None:
    workload = open_workload("synthetic:duration_s=120,rate_per_s=4", seed=2)
    span = workload.requests[5].arrival_s
    started = time.monotonic()
    sent = asyncio.run(
        publish_workload(
            KafkaConnection.plaintext(broker), workload, rate_scale=span / 0.5, model=unique("m"), limit=6
        )
    )
    assert sent == 6 and time.monotonic() - started >= 0.45


def test_a_batch_file_becomes_one_job(broker: str, tmp_path: Path) -> None:
    path = tmp_path / "job.jsonl"
    rows = [
        {"timestamp": i * 10, "input_length": 700, "output_length": 30, "hash_ids": [i, 99]} for i in range(3)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    job_id = unique("job")

    def parse(topic: str, value: bytes) -> Event | None:
        job = BatchJob.model_validate_json(value)
        return job if job.job_id == job_id else None

    async def scenario() -> list[Event]:
        await asyncio.wait_for(
            submit_batch(KafkaConnection.plaintext(broker), path, parse_duration("30m"), job_id=job_id),
            TIMEOUT_S,
        )
        return await asyncio.wait_for(collect(broker, [BATCH_JOBS.name], parse, bool), TIMEOUT_S)

    [job] = asyncio.run(scenario())
    assert isinstance(job, BatchJob) and job.deadline_s == 1800 and len(job.requests) == 3
    assert {r.slo_class for r in job.requests} == {"batch"}
    assert all(r.request_id.startswith(f"{job_id}/") for r in job.requests)
    assert all(r.deadline_ts == pytest.approx(job.ts + 1800) for r in job.requests)


@pytest.mark.parametrize(
    ("text", "seconds"), [("30m", 1800), ("2h", 7200), ("90s", 90), ("45", 45), ("1.5h", 5400)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "10x", "-5m", "0", "m"])
def test_parse_duration_rejects_nonsense_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)
