"""The load generator: a workload's requests onto ``tf.requests``, a batch file onto ``tf.batch.jobs``.

Requests carry what a client knows (prompt counts and hashes, the ``max_tokens`` budget), never
the trace's output length: the emulated fleet is given the workload's lengths by request id
(``workload_output_tokens``), so the production contract has no emulation field.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from infra.kafka.clients import ResilientProducer
from infra.kafka.connection import KafkaConnection
from infra.kafka.request_client import RequestClient
from schemas.codec import encode
from schemas.events import BatchJob, InferenceRequest
from schemas.topics import BATCH_JOBS, REQUESTS
from sim.workloads.trace import DEFAULT_OUTPUT_BUDGET, TraceRequest, Workload, load_workload

# Deliveries awaited at once when publishing as fast as possible: bounds memory, keeps batching.
_IN_FLIGHT = 5000
# A batch job is one message; the broker must accept it (Kafka's default limit is 1 MiB).
_MAX_JOB_BYTES = 16 * 1024 * 1024

_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
LONGEST_OPTION_S = 1e7  # about 115 days


def parse_duration(text: str) -> float:
    """Seconds in ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"`` or ``"45"`` (seconds); must be > 0
    and at most ``LONGEST_OPTION_S``."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(
            f"invalid duration {text!r}: expected a number with an optional unit s, m, h or d "
            "(e.g. 90s, 30m, 2h)"
        )
    seconds = float(match.group(1)) * _UNIT_S[match.group(2).lower()]
    if seconds <= 0:
        raise ValueError(f"invalid duration {text!r}: must be > 0")
    if not math.isfinite(seconds) or seconds > LONGEST_OPTION_S:
        raise ValueError(f"invalid duration {text[:40]!r}: must be at most {LONGEST_OPTION_S:.0e} s")
    return seconds


def to_inference_request(
    request: TraceRequest, model: str, now: float, request_id: str | None = None
) -> InferenceRequest:
    """The wire form of a trace request arriving at ``now`` (its deadline counted from then)."""
    return InferenceRequest(
        ts=now,
        request_id=request_id or request.request_id,
        tenant=request.tenant,
        model=request.model or model,
        task_type=request.task_type,
        prompt_block_hashes=request.block_hashes,
        input_tokens=request.input_tokens,
        output_budget=request.max_tokens or DEFAULT_OUTPUT_BUDGET,
        slo_class=request.slo_class,
        deadline_ts=None if request.deadline_s is None else now + request.deadline_s,
    )


def workload_output_tokens(workload: Workload) -> dict[str, int]:
    """Request id -> output length, for the emulated fleet (``run_fleet(output_tokens=...)``):
    the ids ``publish_workload`` gives the requests."""
    return {r.request_id: r.output_tokens for r in workload.requests}


async def publish_workload(
    connection: KafkaConnection,
    workload: Workload,
    rate_scale: float = 1.0,
    model: str = "llama3-8b",
    limit: int | None = None,
    duration_s: float | None = None,
    realtime: bool = True,
    *,
    partitions: int | None = None,
    retry_budget_s: float = 60.0,
    on_sent: Callable[[InferenceRequest], object] | None = None,
) -> int:
    """Publish the workload's requests (arrivals ``rate_scale`` times as fast) to ``tf.requests``,
    keyed by model; return how many were sent (all delivered).

    ``realtime``: each at its arrival time after the start; else as fast as possible. Stops after
    ``limit`` requests or at the first arrival after ``duration_s`` (scaled seconds).

    A broker outage is retried (``infra.kafka.clients.ResilientProducer``: topics recreated,
    undelivered requests sent again, at least once) for ``retry_budget_s``; then
    ``BrokerUnavailable`` (a ``ConnectionError``: the CLI prints one line and exits 2).
    ``on_sent``: called with each request once it is queued (``publish_and_await``).
    """
    requests = workload.scaled(rate_scale).requests
    producer = ResilientProducer(
        connection,
        lambda: AIOKafkaProducer(**connection.client_options(), linger_ms=5, request_timeout_ms=10_000),
        "loadgen",
        _partitions(partitions),
        budget_s=retry_budget_s,
    )
    await producer.start()
    try:
        start = time.monotonic()
        sent = 0
        for request in requests:
            if (limit is not None and sent >= limit) or (
                duration_s is not None and request.arrival_s > duration_s
            ):
                break
            if realtime and start + request.arrival_s > time.monotonic():
                await producer.flush()  # deliver what is due before idling
                await asyncio.sleep(max(0.0, start + request.arrival_s - time.monotonic()))
            event = to_inference_request(request, model, time.time())
            await producer.send(REQUESTS, event)
            if on_sent is not None:
                on_sent(event)
            sent += 1
            if producer.pending >= _IN_FLIGHT:
                await producer.flush()
        await producer.flush()
        return sent
    finally:
        await producer.stop()


async def publish_and_await(
    connection: KafkaConnection,
    workload: Workload,
    answers_timeout_s: float,
    resend_after_s: float = 30.0,
    **publish: Any,
) -> tuple[int, int, int]:
    """``publish_workload``, then wait up to ``answers_timeout_s`` for every request's answer as a
    client does (``infra.kafka.request_client.RequestClient``: a ``Response`` or a reject; a
    request with no answer after ``resend_after_s`` is published again, the same event);
    returns (sent, answered, never answered)."""
    client = RequestClient(connection, resend_after_s, give_up_after_s=LONGEST_OPTION_S)
    await client.start()
    try:
        futures: list[asyncio.Future[Any]] = []
        sent = await publish_workload(
            connection, workload, on_sent=lambda r: futures.append(client.track(r)), **publish
        )
        if futures:
            await asyncio.wait(futures, timeout=answers_timeout_s)
        answered = sum(1 for f in futures if f.done() and not f.cancelled() and f.exception() is None)
        return sent, answered, sent - answered
    finally:
        await client.stop()


def read_batch_job(
    path: Path, deadline_s: float, model: str = "llama3-8b", job_id: str | None = None
) -> BatchJob:
    """The batch job of a JSONL file: a Mooncake-style trace or OpenAI batch lines
    (``prompt_requests``), every request of class ``batch`` due ``deadline_s`` from now.

    Request ids become ``JOB/ID`` so two jobs from the same file never share one.
    ``ValueError`` (or ``OSError``): unreadable file, bad deadline, or a job too large for one
    message. Reads nothing but the file: a command checks its input before it looks for a broker.
    """
    if not 0 < deadline_s <= LONGEST_OPTION_S:  # NaN too
        raise ValueError(f"the deadline must be > 0 and at most {LONGEST_OPTION_S:.0e} s")
    job_id = job_id or f"job-{uuid.uuid4().hex[:12]}"
    now = time.time()
    if _is_openai_batch(path):
        requests = prompt_requests(path, job_id, model, now, deadline_s)
    else:
        workload = load_workload(path)
        requests = tuple(
            to_inference_request(
                replace(r, slo_class="batch", deadline_s=deadline_s), model, now, f"{job_id}/{r.request_id}"
            )
            for r in workload.requests
        )
    tenants = {r.tenant for r in requests}
    job = BatchJob(
        ts=now,
        job_id=job_id,
        tenant=tenants.pop() if len(tenants) == 1 else "default",
        deadline_s=deadline_s,
        requests=requests,
    )
    size = len(encode(job))
    if size > _MAX_JOB_BYTES:
        raise ValueError(
            f"{path}: the job is {size} bytes as one message (limit {_MAX_JOB_BYTES}); split the file"
        )
    return job


async def publish_batch(
    connection: KafkaConnection, job: BatchJob, *, partitions: int | None = None, retry_budget_s: float = 60.0
) -> None:
    """Publish ``job`` (``read_batch_job``) to ``tf.batch.jobs``, keyed by its id; a broker
    outage is retried for ``retry_budget_s`` as ``publish_workload`` retries it."""
    producer = ResilientProducer(
        connection,
        lambda: AIOKafkaProducer(
            **connection.client_options(), max_request_size=_MAX_JOB_BYTES + 4096, request_timeout_ms=10_000
        ),
        "batch submit",
        _partitions(partitions),
        budget_s=retry_budget_s,
    )
    await producer.start()
    try:
        await producer.send(BATCH_JOBS, job)
        await producer.flush()
    finally:
        await producer.stop()


async def submit_batch(
    connection: KafkaConnection,
    path: Path,
    deadline_s: float,
    model: str = "llama3-8b",
    job_id: str | None = None,
    *,
    partitions: int | None = None,
    retry_budget_s: float = 60.0,
) -> BatchJob:
    """``read_batch_job`` then ``publish_batch``; returns the job published."""
    job = read_batch_job(path, deadline_s, model, job_id)
    await publish_batch(connection, job, partitions=partitions, retry_budget_s=retry_budget_s)
    return job


def _is_openai_batch(path: Path) -> bool:
    """Whether ``path`` holds OpenAI batch lines (``{"custom_id", "url", "body"}``), not a trace."""
    try:
        with path.open() as lines:
            first = next((line for line in lines if line.strip()), "")
        record = json.loads(first)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and "body" in record


def prompt_requests(
    path: Path, job_id: str, model: str, now: float, deadline_s: float
) -> tuple[InferenceRequest, ...]:
    """The requests of an OpenAI batch file (one ``{"custom_id", "url", "body"}`` a line, ``url``
    ``/v1/chat/completions`` or ``/v1/completions``; the body's ``model`` defaults to ``model``),
    ids ``JOB/custom_id``, class ``batch``, due ``deadline_s`` from now, answered on
    ``tf.responses``. ``ValueError`` names the bad line."""
    from gateway.openai_api import ApiError, parse_body

    requests = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ApiError(400, "expected a JSON object")
            url = record.get("url", "/v1/chat/completions")
            kinds = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
            if url not in kinds:
                raise ApiError(400, f"url must be one of {sorted(kinds)}, not {url!r}")
            body = {"model": model, **(record.get("body") or {})}
            custom_id = str(record.get("custom_id") or f"line-{number}")
            request, _call = parse_body(
                kinds[url],  # type: ignore[arg-type]
                body,
                f"{job_id}/{custom_id}",
                "default",
                "batch",
                {str(body["model"])},
            )
        except ApiError as exc:
            raise ValueError(f"{path}:{number}: {exc.message}") from None
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
        requests.append(
            request.model_copy(update={"ts": now, "deadline_ts": now + deadline_s, "reply": "kafka"})
        )
    if not requests:
        raise ValueError(f"{path}: no requests")
    return tuple(requests)


def _partitions(partitions: int | None) -> int:
    """Partitions of the topics recreated after a broker lost them (default: the settings')."""
    if partitions is not None:
        return partitions
    from infra.settings import Settings

    return Settings().topic_partitions
