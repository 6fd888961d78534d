"""One measured run of the streaming benchmark (``bench.stream``): its requests, how they are
published, how the decisions are counted, and the figures.

A run has two phases on a worker that is ready and warm: (a) throughput, N pre-encoded requests
published as fast as aiokafka batches them; (b) latency, at a share of (a)'s rate, what is due
sent every few milliseconds as one record batch. What each figure means: ``RunFigures`` and the
command's docstring.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import random
import sys
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from agents.affinity import HotPrefixes
from agents.policy.types import BLOCK_TOKENS
from infra.kafka.clients import start_client
from lab.measure import (
    CpuMeter,
    CpuShares,
    bucket_delta,
    histogram_quantile,
    paused_gc,
    percentile_ms,
    scrape_buckets,
)
from lab.stack import Collector, heartbeat
from schemas.codec import decode, encode
from schemas.events import Heartbeat, InferenceRequest
from schemas.topics import DECISIONS, REQUESTS

MODEL = "llama3-8b"
INSTANCES = 8
SHARED_PREFIXES = 64  # system prompts / documents several requests start with
_TS_PLACEHOLDER = b'"ts":0.0,'
_IN_FLIGHT = 5000  # deliveries awaited at once while publishing as fast as possible

WORKER_HISTOGRAM = "tokenfleet_decision_latency_seconds"


def log(text: str) -> None:
    print(f"[bench-stream] {text}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class Received:
    """A decision of the current run as the counting consumer saw it."""

    consumed_s: float  # time.time() when the consumer got it
    produced_s: float  # the record's timestamp: when the worker sent it (ms resolution)
    value: bytes


@dataclass(frozen=True, slots=True)
class RunFigures:
    publish_per_s: float
    routed_per_s: float
    routed: int
    duplicates: int
    mean_batch: float
    throughput_cpu: CpuShares
    worker_cpu_us_per_request: float
    rate_target_per_s: float
    rate_achieved_per_s: float
    latency_sent: int
    latency_routed: int
    latency_cpu: CpuShares
    worker_p50_ms: float  # the worker's own histogram: request batch fetched -> decisions sent
    worker_p99_ms: float
    decision_p50_ms: float  # broker ack of the request -> decision created (the decision latency)
    decision_p99_ms: float
    publish_p50_ms: float  # request ts -> broker ack (the publisher's own queueing and round trip)
    publish_p99_ms: float
    created_p50_ms: float  # request ts -> decision created (its record timestamp)
    created_p99_ms: float
    e2e_p50_ms: float  # request ts -> decision consumed by the benchmark
    e2e_p99_ms: float
    e2e_max_ms: float
    policy_p50_us: float
    policy_p99_us: float


# ---------------------------------------------------------------- request payloads


class RequestFactory:
    """Wire bytes of benchmark requests: pre-encoded once; ``ts`` is stamped at send time."""

    def __init__(self, seed: int = 0, hot: HotPrefixes | None = None) -> None:
        """``hot``: every request starts with one 8-block prefix (a long shared system prompt),
        placed by this publisher's ``HotPrefixes`` (``agents.affinity``) before it is encoded."""
        self.rng = random.Random(seed)
        self.prefixes = [
            [self.rng.getrandbits(62) for _ in range(self.rng.randint(2, 8))] for _ in range(SHARED_PREFIXES)
        ]
        self.hot = hot
        if hot is not None:
            self.prefixes = [self.prefixes[0][:1] + [self.rng.getrandbits(62) for _ in range(7)]]

    def request(self, request_id: str) -> InferenceRequest:
        input_tokens = self.rng.randint(8000, 10_500)
        blocks = input_tokens // BLOCK_TOKENS
        prefix = self.prefixes[self.rng.randrange(len(self.prefixes))][:blocks]
        hashes = prefix + [self.rng.getrandbits(62) for _ in range(blocks - len(prefix))]
        request = InferenceRequest(
            ts=0.0,
            request_id=request_id,
            tenant=f"tenant-{self.rng.randrange(16)}",
            model=MODEL,
            prompt_block_hashes=tuple(hashes),
            input_tokens=input_tokens,
            output_budget=self.rng.choice((128, 256, 512, 1024)),
        )
        return request if self.hot is None else self.hot.place(request, time.time())

    def encoded(self, run: str, count: int) -> list[tuple[bytes, bytes]]:
        """``count`` requests of ``run`` as (head, tail) around the ``ts`` value."""
        out = []
        for i in range(count):
            raw = encode(self.request(f"{run}-{i}"))
            head, sep, tail = raw.partition(_TS_PLACEHOLDER)
            if not sep:
                raise AssertionError(f"no {_TS_PLACEHOLDER!r} in an encoded request: {raw[:200]!r}")
            out.append((head + b'"ts":', b"," + tail))
        decode(InferenceRequest, stamp(out[0], time.time()))  # the stamped bytes are a valid request
        return out


def stamp(parts: tuple[bytes, bytes], ts: float) -> bytes:
    return parts[0] + repr(ts).encode() + parts[1]


# ---------------------------------------------------------------- broker clients


class DecisionCounter(Collector):
    """Reads ``tf.decisions`` from the end of its log (``lab.stack.Collector``: every position
    fixed before ``start`` returns, so everything published afterwards is seen) and keeps the
    current run's decisions, recognised by the run's request-id prefix (``begin``)."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(
            bootstrap,
            [DECISIONS],
            from_start=False,
            poll_ms=100,
            what="decision counter",
            max_poll_records=5000,
            # Tansu answers a fetch only when this wait is over, even if data arrived: it
            # bounds what the consumer adds to the measured latency (5 ms starves it).
            fetch_max_wait_ms=20,
        )
        self.marker = b""
        self.received: list[Received] = []

    def begin(self, run: str) -> None:
        self.marker = f'"request_id":"{run}-'.encode()
        self.received = []

    def take(self, topic: str, records: Sequence[Any], now: float) -> None:
        marker, keep = self.marker, self.received.append
        if not marker:
            return
        for record in records:
            if marker in record.value:
                keep(Received(now, record.timestamp / 1e3, record.value))

    async def wait_for(self, count: int, stall_s: float, limit_s: float) -> None:
        """Until ``count`` decisions arrived, none came for ``stall_s``, or ``limit_s`` passed."""
        deadline = time.monotonic() + limit_s
        seen, last_progress = -1, time.monotonic()
        while len(self.received) < count:
            now = time.monotonic()
            if len(self.received) != seen:
                seen, last_progress = len(self.received), now
            if now - last_progress > stall_s or now > deadline:
                return
            self.check()  # the consumer failed: raise its error
            await asyncio.sleep(0.05)


def idle_instances() -> list[Heartbeat]:
    """The fleet the worker routes to: ``INSTANCES`` idle, ready instances of ``MODEL`` in two
    DCs (``lab.stack.StaticFleet`` sends them: nothing executes, the worker is measured alone)."""
    return [
        heartbeat(MODEL, f"{MODEL}-{i}", dc=f"dc-{i % 2}", model_version="v1", kv_blocks_total=4096)
        for i in range(INSTANCES)
    ]


async def publish_all(producer: Any, payloads: Sequence[tuple[bytes, bytes]]) -> tuple[float, float]:
    """Publish every request as fast as possible; (first send, last delivery) in time.time()."""
    key = MODEL.encode()
    pending: list[Awaitable[Any]] = []
    first = time.time()
    for parts in payloads:
        pending.append(await producer.send(REQUESTS.name, stamp(parts, time.time()), key=key))
        if len(pending) >= _IN_FLIGHT:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return first, time.time()


async def publish_at_rate(
    producer: Any, payloads: Sequence[tuple[bytes, bytes]], rate_per_s: float, seconds: float, tick_s: float
) -> tuple[list[float], float]:
    """Publish request i at start + i / rate until ``seconds``: every ``tick_s``, the requests
    due are stamped and sent as one record batch (what a producer lingering ``tick_s`` sends,
    for a fraction of the CPU of one ``send`` per request: the load generator shares the
    machine with the system it measures).

    Returns the time.time() of each sent request's broker acknowledgement (nan if none came)
    and the seconds spent sending.
    """
    key = MODEL.encode()
    partitions = sorted(await producer.partitions_for(REQUESTS.name))
    partition = DefaultPartitioner()(key, partitions, partitions)
    acked: list[float] = []
    pending: list[asyncio.Future[Any]] = []
    start = time.monotonic()
    sent = 0
    while sent < len(payloads):
        elapsed = time.monotonic() - start
        if elapsed >= seconds:
            break
        due = min(len(payloads), int(elapsed * rate_per_s) + 1)
        while sent < due:
            first, batch, now = sent, producer.create_batch(), time.time()
            while sent < due and batch.append(timestamp=None, key=key, value=stamp(payloads[sent], now)):
                sent += 1
            acked.extend([math.nan] * (sent - first))
            delivery = await producer.send_batch(batch, REQUESTS.name, partition=partition)
            delivery.add_done_callback(functools.partial(_record_acks, acked, first, sent))
            pending.append(delivery)
        if len(pending) >= _IN_FLIGHT:
            await asyncio.gather(*pending)
            pending.clear()
        await asyncio.sleep(tick_s)
    await asyncio.gather(*pending)
    return acked, time.monotonic() - start


def _record_acks(acked: list[float], first: int, end: int, delivery: asyncio.Future[Any]) -> None:
    if not delivery.cancelled() and delivery.exception() is None:
        acked[first:end] = [time.time()] * (end - first)


# ---------------------------------------------------------------- one run


def _parsed(received: Sequence[Received]) -> tuple[list[tuple[Received, dict[str, Any]]], int]:
    """(how it arrived, decision) per distinct request, in arrival order; and the duplicates."""
    seen: set[str] = set()
    out = []
    for item in received:
        decision = json.loads(item.value)
        if decision["request_id"] in seen:
            continue
        seen.add(decision["request_id"])
        out.append((item, decision))
    return out, len(received) - len(out)


def _policy_calls(decisions: Sequence[dict[str, Any]]) -> int:
    """Policy calls behind the decisions: one batch shares one ``decision_latency_s`` value."""
    calls, previous = 0, None
    for decision in decisions:
        if decision["decision_latency_s"] != previous:
            calls, previous = calls + 1, decision["decision_latency_s"]
    return max(calls, 1)


async def one_run(
    run: str,
    args: argparse.Namespace,
    bootstrap: str,
    counter: DecisionCounter,
    factory: RequestFactory,
    worker_pid: int,
    metrics_url: str,
) -> RunFigures:
    fast_payloads = factory.encoded(f"{run}a", args.requests)
    meter = CpuMeter(worker_pid)
    producer = await start_client(
        lambda: AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=512 * 1024, acks=1),
        "bench producer",
    )
    try:
        # (a) throughput
        counter.begin(f"{run}a")
        with paused_gc():
            meter.start()
            first, delivered = await publish_all(producer, fast_payloads)
            publish_per_s = args.requests / max(delivered - first, 1e-9)
            log(f"{run}: published {args.requests} in {delivered - first:.2f} s; waiting for decisions")
            await counter.wait_for(args.requests, stall_s=args.stall, limit_s=args.requests / 500 + 60)
            throughput_cpu = meter.stop()
        decisions, duplicates = _parsed(counter.received)
        if not decisions:
            raise RuntimeError(f"{run}: no routing decision arrived (see the worker log)")
        last = max(item.consumed_s for item, _ in decisions)
        routed_per_s = len(decisions) / max(last - first, 1e-9)
        mean_batch = len(decisions) / _policy_calls([d for _, d in decisions])
        log(f"{run}: {len(decisions)} routed, {routed_per_s:,.0f}/s; {throughput_cpu}")
    finally:
        await producer.stop()

    # (b) latency at a share of the measured rate
    rate = max(1.0, args.rate_share * routed_per_s)
    slow_payloads = factory.encoded(f"{run}b", int(rate * args.seconds) + 1)
    producer = await start_client(
        lambda: AIOKafkaProducer(bootstrap_servers=bootstrap, acks=1),
        "bench producer",
    )
    try:
        await asyncio.sleep(1.0)  # the backlog of (a) is gone
        counter.begin(f"{run}b")
        log(f"{run}: latency at {rate:,.0f} requests/s for {args.seconds:.0f} s")
        with paused_gc():
            meter.start()
            histogram_before = await asyncio.to_thread(scrape_buckets, metrics_url, WORKER_HISTOGRAM)
            tick_s = max(args.publisher_linger_ms, 1) / 1000
            acked, elapsed = await publish_at_rate(producer, slow_payloads, rate, args.seconds, tick_s)
            latency_cpu = meter.stop()
            await counter.wait_for(len(acked), stall_s=args.stall, limit_s=30)
            histogram = bucket_delta(
                await asyncio.to_thread(scrape_buckets, metrics_url, WORKER_HISTOGRAM), histogram_before
            )
        timed, _ = _parsed(counter.received)
    finally:
        await producer.stop()
    prefix = len(f"{run}b-")
    ack = [acked[int(d["request_id"][prefix:])] for _, d in timed]
    ts = [d["request"]["ts"] for _, d in timed]
    decision = [item.produced_s - a for (item, _), a in zip(timed, ack, strict=True)]
    publish = [a - t for a, t in zip(ack, ts, strict=True)]
    created = [item.produced_s - t for (item, _), t in zip(timed, ts, strict=True)]
    e2e = [item.consumed_s - t for (item, _), t in zip(timed, ts, strict=True)]
    policy = [d["decision_latency_s"] for _, d in timed]
    log(f"{run}: {len(timed)} of {len(acked)} routed; {latency_cpu}")
    return RunFigures(
        publish_per_s=publish_per_s,
        routed_per_s=routed_per_s,
        routed=len(decisions),
        duplicates=duplicates,
        mean_batch=mean_batch,
        throughput_cpu=throughput_cpu,
        worker_cpu_us_per_request=1e6 * throughput_cpu.worker * (last - first) / len(decisions),
        rate_target_per_s=rate,
        rate_achieved_per_s=len(acked) / max(elapsed, 1e-9),
        latency_sent=len(acked),
        latency_routed=len(timed),
        latency_cpu=latency_cpu,
        worker_p50_ms=1e3 * histogram_quantile(histogram, 0.50),
        worker_p99_ms=1e3 * histogram_quantile(histogram, 0.99),
        decision_p50_ms=percentile_ms(decision, 0.50),
        decision_p99_ms=percentile_ms(decision, 0.99),
        publish_p50_ms=percentile_ms(publish, 0.50),
        publish_p99_ms=percentile_ms(publish, 0.99),
        created_p50_ms=percentile_ms(created, 0.50),
        created_p99_ms=percentile_ms(created, 0.99),
        e2e_p50_ms=percentile_ms(e2e, 0.50),
        e2e_p99_ms=percentile_ms(e2e, 0.99),
        e2e_max_ms=1e3 * max(e2e, default=math.nan),
        policy_p50_us=1e3 * percentile_ms(policy, 0.50),
        policy_p99_us=1e3 * percentile_ms(policy, 0.99),
    )
