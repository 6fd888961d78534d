"""``tokenfleet batch results JOB --out F.jsonl``: a batch job's answers, from ``tf.responses``.

The job's size comes from its message on ``tf.batch.jobs``; the answers are the ``Response``
events whose request id is ``JOB/...`` (the last attempt of each wins), or the scheduler's reject
on ``tf.admission``. Waits until every request has one or ``timeout_s`` passes, publishing a
request again when it has had no answer for ``resend_after_s``, then writes one JSON line per
answer, in the job's order: ``{"custom_id", "request_id", "status", "text", "finish_reason",
"usage", "error"}`` (a reject: status ``rejected``, its reason as ``error``).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from agents.batch import expand_batch_job
from infra.kafka.clients import partition_reader
from infra.kafka.connection import KafkaConnection
from infra.kafka.request_client import Answer, RequestClient
from schemas.codec import DecodeError, decode
from schemas.events import AdmissionDecision, BatchJob, Response
from schemas.topics import ADMISSION, BATCH_JOBS, RESPONSES, TopicSpec


async def collect_results(
    connection: KafkaConnection, job_id: str, out: Path, timeout_s: float = 60.0, resend_after_s: float = 30.0
) -> tuple[int, int]:
    """Write the answers of ``job_id`` to ``out``; returns (answers written, requests in the job).
    ``ValueError`` if no such job is on ``tf.batch.jobs``.

    First what the log already holds (``tf.responses`` and the rejects on ``tf.admission``,
    from their start); then the answers still missing are awaited as a client does
    (``infra.kafka.request_client.RequestClient``, started first so none is missed between):
    a request with no answer ``resend_after_s`` later is published again, the same event (a
    broker may have lost it; the scheduler decides it once), until ``timeout_s`` has passed."""
    job = await _find_job(connection, job_id)
    if job is None:
        raise ValueError(f"no batch job {job_id!r} on {BATCH_JOBS.name}")
    requests = {r.request_id: r for r in expand_batch_job(job)}
    order = list(requests)
    deadline = time.monotonic() + timeout_s
    client = RequestClient(
        connection, resend_after_s=resend_after_s, give_up_after_s=max(timeout_s, resend_after_s)
    )
    await client.start()
    try:
        answers = await _answers_on_the_log(connection, f"{job_id}/", set(order))
        waiting = {rid: client.track(requests[rid]) for rid in order if rid not in answers}
        if waiting:
            await asyncio.wait(waiting.values(), timeout=max(0.0, deadline - time.monotonic()))
        for rid, future in waiting.items():
            if future.done() and not future.cancelled() and future.exception() is None:
                answers[rid] = future.result()
    finally:
        await client.stop()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as lines:
        for request_id in order:
            answer = answers.get(request_id)
            if answer is not None:
                lines.write(
                    json.dumps(_line(request_id.removeprefix(f"{job_id}/"), request_id, answer)) + "\n"
                )
    return len(answers), len(order)


def _line(custom_id: str, request_id: str, answer: Answer) -> dict[str, object]:
    """One line of the results file; a reject has status ``rejected`` and its reason as error."""
    if isinstance(answer, AdmissionDecision):
        return {
            "custom_id": custom_id, "request_id": request_id, "status": "rejected", "text": "",
            "finish_reason": None, "usage": None, "error": answer.reason,
        }  # fmt: skip
    return {
        "custom_id": custom_id,
        "request_id": request_id,
        "status": answer.status,
        "text": answer.text,
        "finish_reason": answer.finish_reason,
        "usage": {
            "prompt_tokens": answer.prompt_tokens,
            "completion_tokens": answer.completion_tokens,
            "cached_tokens": answer.cached_tokens,
        },
        "error": answer.error,
    }


async def _answers_on_the_log(
    connection: KafkaConnection, prefix: str, wanted: set[str]
) -> dict[str, Answer]:
    """The answers to ``wanted`` requests on ``tf.responses`` and ``tf.admission`` (rejects), read
    from the start to the end they had when this began; per request the last attempt's."""
    consumer = await _reader(connection, RESPONSES, ADMISSION)
    answers: dict[str, Answer] = {}
    try:
        ends = await consumer.end_offsets(list(consumer.assignment()))
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            for tp, records in batches.items():
                kind: type[Answer] = Response if tp.topic == RESPONSES.name else AdmissionDecision
                for record in records:
                    if record.value is None or prefix.encode() not in record.value[:1024]:
                        continue
                    try:
                        answer = decode(kind, record.value)
                    except DecodeError:
                        continue
                    if isinstance(answer, AdmissionDecision) and answer.action != "reject":
                        continue
                    previous = answers.get(answer.request_id)
                    if answer.request_id in wanted and (
                        previous is None or previous.attempt <= answer.attempt
                    ):
                        answers[answer.request_id] = answer
    finally:
        await consumer.stop()
    return answers


async def _find_job(connection: KafkaConnection, job_id: str) -> BatchJob | None:
    """The job's message, read from the start of ``tf.batch.jobs`` to its current end."""
    consumer = await _reader(connection, BATCH_JOBS)
    try:
        ends = await consumer.end_offsets(list(consumer.assignment()))
        found = None
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            batches = await consumer.getmany(timeout_ms=500, max_records=100)
            for records in batches.values():
                for record in records:
                    if record.value is not None and job_id.encode() in record.value[:4096]:
                        try:
                            job = decode(BatchJob, record.value)
                        except DecodeError:
                            continue
                        if job.job_id == job_id:
                            found = job
        return found
    finally:
        await consumer.stop()


async def _reader(connection: KafkaConnection, *specs: TopicSpec) -> AIOKafkaConsumer:
    """A consumer outside any group on every partition of ``specs``' topics, from the start."""
    consumer: AIOKafkaConsumer = await partition_reader(
        connection,
        specs,
        "beginning",
        f"{specs[0].name} reader",
        max_partition_fetch_bytes=32 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    return consumer
