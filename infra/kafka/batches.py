"""``tokenfleet batch results JOB --out F.jsonl``: a batch job's answers, from ``tf.responses``.

The job's size comes from its message on ``tf.batch.jobs``; the answers are the ``Response``
events whose request id is ``JOB/...`` (the last attempt of each wins). Waits until every request
has one or ``timeout_s`` passes, then writes one JSON line per answer, in the job's order:
``{"custom_id", "request_id", "status", "text", "finish_reason", "usage", "error"}``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from infra.kafka.clients import partition_reader
from schemas.codec import DecodeError, decode
from schemas.events import BatchJob, Response
from schemas.topics import BATCH_JOBS, RESPONSES, TopicSpec


async def collect_results(bootstrap: str, job_id: str, out: Path, timeout_s: float = 60.0) -> tuple[int, int]:
    """Write the answers of ``job_id`` to ``out``; returns (answers written, requests in the job).
    ``ValueError`` if no such job is on ``tf.batch.jobs``."""
    job = await _find_job(bootstrap, job_id)
    if job is None:
        raise ValueError(f"no batch job {job_id!r} on {BATCH_JOBS.name}")
    prefix = f"{job_id}/"
    order = [r.request_id if r.request_id.startswith(prefix) else prefix + r.request_id for r in job.requests]
    wanted = set(order)
    answers: dict[str, Response] = {}
    deadline = time.monotonic() + timeout_s
    consumer = await _reader(bootstrap, RESPONSES)
    try:
        while len(answers) < len(wanted) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200, max_records=2000)
            for records in batches.values():
                for record in records:
                    if record.value is None or prefix.encode() not in record.value[:1024]:
                        continue
                    try:
                        response = decode(Response, record.value)
                    except DecodeError:
                        continue
                    previous = answers.get(response.request_id)
                    if response.request_id in wanted and (
                        previous is None or previous.attempt <= response.attempt
                    ):
                        answers[response.request_id] = response
    finally:
        await consumer.stop()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as lines:
        for request_id in order:
            answer = answers.get(request_id)
            if answer is None:
                continue
            lines.write(
                json.dumps(
                    {
                        "custom_id": request_id.removeprefix(prefix),
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
                )
                + "\n"
            )
    return len(answers), len(order)


async def _find_job(bootstrap: str, job_id: str) -> BatchJob | None:
    """The job's message, read from the start of ``tf.batch.jobs`` to its current end."""
    consumer = await _reader(bootstrap, BATCH_JOBS)
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


async def _reader(bootstrap: str, spec: TopicSpec) -> AIOKafkaConsumer:
    """A consumer outside any group on every partition of ``spec``'s topic, from the start."""
    consumer: AIOKafkaConsumer = await partition_reader(
        bootstrap,
        (spec,),
        "beginning",
        f"{spec.name} reader",
        max_partition_fetch_bytes=32 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    return consumer
