"""Streaming benchmark: requests routed per second by one worker, end to end through the broker.

``python -m bench.stream [--requests N] [--policy NAME] [--feedback] [--repeat K] [--fresh-broker]``

Starts the embedded broker, a ``tokenfleet worker`` subprocess (feedback sink off unless
``--feedback``), heartbeats for 8 ``llama3-8b`` instances, and a counting consumer of its own
that has joined and fixed its offsets before anything is published. Then, per run:

(a) throughput: N pre-encoded requests (about 8k input tokens, 15-20 prompt blocks sharing
    prefixes) published as fast as aiokafka batches them; routed/s = N / (last decision
    consumed - first request published);
(b) latency at ``--rate-share`` (default half) of (a)'s rate for ``--seconds``. Each request
    is timed at three points: ``ts`` (stamped by the publisher just before ``send``), the
    broker's acknowledgement (the request is in the log, where the worker can read it), and
    the decision's record timestamp (created by the worker, ms resolution). The decision
    latency is ack -> decision created; ts -> decision created adds the publisher's own
    queueing; ts -> decision consumed adds the counting consumer's fetch wait as well.

CPU shares of the worker, the broker and this process are printed per phase: everything runs on
one machine, so a phase where the three add up to the cores available measures the machine.

The embedded broker (Tansu 0.6, memory storage) lists every record batch ever written to a
partition on each fetch that returns data, so its fetch cost grows with the number of batches
in ``tf.requests``. A publisher sending one request per produce request (``linger_ms=0`` at a
few thousand per second) writes tens of thousands of batches per run and slows every later
fetch; the latency phase's publisher sends what is due every ``--publisher-linger-ms`` (default
5 ms, the Kafka 4 producer's default linger, like a gateway batching its clients' requests) as
one record batch, stamping ``ts`` when it sends. Even so, the broker's CPU per request grows
run after run on one broker; ``--fresh-broker`` gives each run a new broker and worker.

The decision latency is bracketed, not exact: the acknowledgement comes after the broker
appended the request (so ack -> decision created may be a little short by up to the produce
round trip), and ts comes before the produce round trip (so ts -> decision created is long).

A run's decisions are recognised by a request-id prefix unique to the run, so earlier runs and
the warm-up never count. Every wait is bounded; the script always ends and stops what it began.
Figures go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from prometheus_client.parser import text_string_to_metric_families

from infra.kafka.broker import embedded_broker, ensure_topics, free_port
from infra.kafka.clients import start_client
from infra.settings import Settings
from lab.worker_process import WorkerProcess
from schemas.codec import decode, encode
from schemas.events import Heartbeat, InferenceRequest
from schemas.topics import DECISIONS, HEARTBEATS, REQUESTS, key_of
from sim.evaluation.metrics import percentile

MODEL = "llama3-8b"
INSTANCES = 8
BLOCK_TOKENS = 512
SHARED_PREFIXES = 64  # system prompts / documents several requests start with
_TS_PLACEHOLDER = b'"ts":0.0,'
_IN_FLIGHT = 5000  # deliveries awaited at once while publishing as fast as possible

REFERENCE = (
    ("bare aiokafka relay (consume, decode, encode, produce)", "~46 000 msg/s"),
    ("minimal Faust relay", "~4 900 msg/s"),
    ("target, one worker", ">= 10 000 routed/s, p99 decision latency <= 20 ms at half rate"),
)


@dataclass(frozen=True, slots=True)
class Received:
    """A decision of the current run as the counting consumer saw it."""

    consumed_s: float  # time.time() when the consumer got it
    produced_s: float  # the record's timestamp: when the worker sent it (ms resolution)
    value: bytes


@dataclass(frozen=True, slots=True)
class CpuShares:
    """CPU seconds per wall second of each process during one phase (nan where unknown)."""

    worker: float
    broker: float
    bench: float

    def __str__(self) -> str:
        return f"CPU worker {self.worker:.0%}, broker {self.broker:.0%}, bench {self.bench:.0%}"


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

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.prefixes = [
            [self.rng.getrandbits(62) for _ in range(self.rng.randint(2, 8))] for _ in range(SHARED_PREFIXES)
        ]

    def request(self, request_id: str) -> InferenceRequest:
        input_tokens = self.rng.randint(8000, 10_500)
        blocks = input_tokens // BLOCK_TOKENS
        prefix = self.prefixes[self.rng.randrange(SHARED_PREFIXES)][:blocks]
        hashes = prefix + [self.rng.getrandbits(62) for _ in range(blocks - len(prefix))]
        return InferenceRequest(
            ts=0.0,
            request_id=request_id,
            tenant=f"tenant-{self.rng.randrange(16)}",
            model=MODEL,
            prompt_block_hashes=tuple(hashes),
            input_tokens=input_tokens,
            output_budget=self.rng.choice((128, 256, 512, 1024)),
        )

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


class DecisionCounter:
    """Consumes ``tf.decisions`` from a group of its own; keeps the current run's decisions.

    ``start`` returns once partitions are assigned and every position is fixed at the end of
    the log, so everything published afterwards is seen.
    """

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.marker = b""
        self.received: list[Received] = []
        self.consumer: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, timeout_s: float = 30.0) -> None:
        self.consumer = await start_client(
            lambda: AIOKafkaConsumer(
                DECISIONS.name,
                bootstrap_servers=self.bootstrap,
                group_id=f"bench-stream-{os.getpid()}-{time.time_ns()}",
                auto_offset_reset="latest",
                enable_auto_commit=False,
                session_timeout_ms=6000,
                rebalance_timeout_ms=6000,
                heartbeat_interval_ms=1000,
                max_poll_records=5000,
                # Tansu answers a fetch only when this wait is over, even if data arrived: it
                # bounds what the consumer adds to the measured latency (5 ms starves it).
                fetch_max_wait_ms=20,
            ),
            "decision counter",
        )
        deadline = time.monotonic() + timeout_s
        while not self.consumer.assignment():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the counting consumer got no partition within {timeout_s:.0f} s")
            await self.consumer.getmany(timeout_ms=200)
        for partition in self.consumer.assignment():
            await self.consumer.position(partition)  # resolves "latest" now, before any publishing
        self._task = asyncio.create_task(self._consume())

    def begin(self, run: str) -> None:
        self.marker = f'"request_id":"{run}-'.encode()
        self.received = []

    async def _consume(self) -> None:
        while True:
            batch: dict[TopicPartition, Any] = await self.consumer.getmany(timeout_ms=100)
            now = time.time()
            marker, keep = self.marker, self.received.append
            for records in batch.values():
                for record in records:
                    if marker and marker in record.value:
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
            if self._task is not None and self._task.done():
                self._task.result()  # the consumer failed: raise its error
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.consumer is not None:
            await self.consumer.stop()


async def heartbeats(bootstrap: str, interval_s: float, stop: asyncio.Event) -> None:
    """Idle, ready instances reporting every ``interval_s`` until ``stop``."""
    producer = await start_client(lambda: AIOKafkaProducer(bootstrap_servers=bootstrap), "heartbeats")
    try:
        while not stop.is_set():
            for i in range(INSTANCES):
                beat = Heartbeat(
                    instance_id=f"{MODEL}-{i}",
                    dc=f"dc-{i % 2}",
                    model=MODEL,
                    model_version="v1",
                    profile="llama3-8b-h100",
                    waiting=0,
                    running=0,
                    tokens_in_flight=0,
                    kv_blocks_used=0,
                    kv_blocks_total=4096,
                )
                await producer.send(HEARTBEATS.name, encode(beat), key=key_of(HEARTBEATS, beat))
            await producer.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
    finally:
        await producer.stop()


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


def percentile_ms(values: Sequence[float], share: float) -> float:
    """The ``share`` quantile (nearest rank, NaN skipped) of seconds, in ms (NaN when empty)."""
    value = percentile(values, 100 * share)
    return math.nan if value is None else 1e3 * value


WORKER_HISTOGRAM = "tokenfleet_decision_latency_seconds"


def scrape_buckets(url: str, histogram: str) -> dict[float, float]:
    """The cumulative bucket counts (upper bound -> count) of ``histogram`` at ``url``."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        float(sample.labels["le"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == f"{histogram}_bucket"
    }


def bucket_delta(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    return {le: count - before.get(le, 0.0) for le, count in after.items()}


def histogram_quantile(buckets: dict[float, float], share: float) -> float:
    """Prometheus's estimate: linear inside the bucket the rank falls in (nan when empty)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return math.nan
    rank, lower, below = share * total, 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if math.isinf(upper):
                return lower  # beyond the largest finite bound: report that bound
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux ``/proc``); nan elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pid() -> int:
    """The embedded broker: this process's child named ``tansu...``; 0 if there is none."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()
        if name.startswith("tansu") and int(fields[1]) == os.getpid():
            return int(entry.name)
    return 0


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No garbage collection in this process while it measures.

    This process keeps every payload and every decision it receives, and a full collection
    walks all of them: measured up to 700 ms per collection, during which nothing is published
    or consumed and every request in flight looks that much slower. What it allocates while
    measuring has no reference cycles worth collecting, so nothing piles up.
    """
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect()


class CpuMeter:
    """CPU shares of the worker, the broker and this process from ``start`` to ``stop``."""

    def __init__(self, worker_pid: int) -> None:
        self.pids = (worker_pid, broker_pid())
        self._wall = 0.0
        self._before = (0.0, 0.0, 0.0)

    def _now(self) -> tuple[float, float, float]:
        worker, broker = (cpu_seconds(pid) if pid else math.nan for pid in self.pids)
        return worker, broker, time.process_time()

    def start(self) -> None:
        self._wall, self._before = time.monotonic(), self._now()

    def stop(self) -> CpuShares:
        wall = max(time.monotonic() - self._wall, 1e-9)
        worker, broker, bench = (b - a for a, b in zip(self._before, self._now(), strict=True))
        return CpuShares(worker / wall, broker / wall, bench / wall)


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
            _log(f"{run}: published {args.requests} in {delivered - first:.2f} s; waiting for decisions")
            await counter.wait_for(args.requests, stall_s=args.stall, limit_s=args.requests / 500 + 60)
            throughput_cpu = meter.stop()
        decisions, duplicates = _parsed(counter.received)
        if not decisions:
            raise RuntimeError(f"{run}: no routing decision arrived (see the worker log)")
        last = max(item.consumed_s for item, _ in decisions)
        routed_per_s = len(decisions) / max(last - first, 1e-9)
        mean_batch = len(decisions) / _policy_calls([d for _, d in decisions])
        _log(f"{run}: {len(decisions)} routed, {routed_per_s:,.0f}/s; {throughput_cpu}")
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
        _log(f"{run}: latency at {rate:,.0f} requests/s for {args.seconds:.0f} s")
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
    _log(f"{run}: {len(timed)} of {len(acked)} routed; {latency_cpu}")
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


# ---------------------------------------------------------------- orchestration


def _log(text: str) -> None:
    print(f"[bench-stream] {text}", file=sys.stderr, flush=True)


def start_worker(
    bootstrap: str, settings: Settings, feedback: bool, extra_env: Sequence[str] = ()
) -> WorkerProcess:
    return WorkerProcess(
        bootstrap,
        settings.data_dir,
        {
            "TOKENFLEET_POLICY": settings.policy,
            "TOKENFLEET_CLICKHOUSE_DSN": settings.clickhouse_url if feedback else "off",
            "TOKENFLEET_WORKER_WEB_PORT": str(settings.worker_web_port),
            "TOKENFLEET_APP_ID": settings.app_id,
            "TOKENFLEET_TOPIC_PARTITIONS": str(settings.topic_partitions),
            **dict(item.split("=", 1) for item in extra_env),
        },
        log_path=settings.data_dir / "worker.log",
    )


async def orchestrate(
    args: argparse.Namespace,
    bootstrap: str,
    settings: Settings,
    worker: WorkerProcess,
    runs: range,
) -> list[RunFigures]:
    counter = DecisionCounter(bootstrap)
    stop_beats = asyncio.Event()
    beats = asyncio.create_task(heartbeats(bootstrap, settings.heartbeat_interval_s, stop_beats))
    factory = RequestFactory(seed=args.seed)
    try:
        await counter.start()
        await worker.wait_ready_async(timeout_s=90)
        await asyncio.sleep(2.0)  # heartbeats reached the instance-state table
        _log("worker ready; warm-up")
        counter.begin("warmup")
        producer = await start_client(lambda: AIOKafkaProducer(bootstrap_servers=bootstrap), "warm-up")
        try:
            await publish_all(producer, factory.encoded("warmup", args.warmup))
        finally:
            await producer.stop()
        await counter.wait_for(args.warmup, stall_s=args.stall, limit_s=60)
        if len(counter.received) < args.warmup:
            raise RuntimeError(
                f"warm-up: {len(counter.received)} of {args.warmup} requests routed (see the worker log)"
            )
        results = []
        for i in runs:
            if worker.process.poll() is not None:
                raise RuntimeError(f"the worker exited with code {worker.process.returncode}")
            metrics = f"http://127.0.0.1:{settings.worker_web_port}/metrics"
            results.append(await one_run(f"run{i}", args, bootstrap, counter, factory, worker.pid, metrics))
            print(format_run(i, results[-1]), flush=True)
        return results
    finally:
        stop_beats.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(beats, timeout=10)
        await counter.stop()


def format_run(index: int, f: RunFigures) -> str:
    return (
        f"run {index}: publish {f.publish_per_s:,.0f} msg/s | routed {f.routed_per_s:,.0f} req/s "
        f"({f.routed} routed, {f.duplicates} duplicates, {f.mean_batch:.0f} requests per policy call, "
        f"{f.worker_cpu_us_per_request:.0f} us worker CPU per request; {f.throughput_cpu})\n"
        f"       at {f.rate_target_per_s:,.0f} req/s (sent {f.rate_achieved_per_s:,.0f}/s, "
        f"{f.latency_routed}/{f.latency_sent} routed; {f.latency_cpu}):\n"
        f"       in the worker (batch fetched -> decisions sent) p50 {f.worker_p50_ms:.1f} ms, "
        f"p99 {f.worker_p99_ms:.1f} ms;\n"
        f"       decision latency (request in the log -> decision created) p50 {f.decision_p50_ms:.1f} ms, "
        f"p99 {f.decision_p99_ms:.1f} ms; ts -> request in the log p50 {f.publish_p50_ms:.1f} ms, "
        f"p99 {f.publish_p99_ms:.1f} ms;\n"
        f"       ts -> decision created p50 {f.created_p50_ms:.1f} ms, p99 {f.created_p99_ms:.1f} ms; "
        f"ts -> decision consumed p50 {f.e2e_p50_ms:.1f} ms, p99 {f.e2e_p99_ms:.1f} ms, "
        f"max {f.e2e_max_ms:.1f} ms; in-policy p50 {f.policy_p50_us:.1f} us, p99 {f.policy_p99_us:.1f} us "
        f"per request"
    )


def format_summary(args: argparse.Namespace, results: Sequence[RunFigures]) -> str:
    def med(name: str) -> float:
        return float(statistics.median(_figure(r, name) for r in results))

    label = f"median of {len(results)} runs" if len(results) > 1 else "measured"
    rows = [
        (
            "publish rate (aiokafka producer)",
            f"{med('publish_per_s'):,.0f} msg/s",
            "bare aiokafka relay ~46 000 msg/s",
        ),
        ("routed requests/s, one worker", f"{med('routed_per_s'):,.0f} req/s", "target >= 10 000 routed/s"),
        ("", "", "minimal Faust relay ~4 900 msg/s"),
        ("worker CPU while routing", f"{med('worker_cpu_us_per_request'):,.0f} us/req", ""),
        (
            "CPU worker / broker / bench, throughput",
            f"{med('throughput_cpu.worker'):.0%} / {med('throughput_cpu.broker'):.0%} / "
            f"{med('throughput_cpu.bench'):.0%}",
            f"of {os.cpu_count()} CPUs",
        ),
        (
            "latency phase rate",
            f"{med('rate_achieved_per_s'):,.0f} req/s",
            f"{args.rate_share:.0%} of routed",
        ),
        (
            "CPU worker / broker / bench, latency",
            f"{med('latency_cpu.worker'):.0%} / {med('latency_cpu.broker'):.0%} / "
            f"{med('latency_cpu.bench'):.0%}",
            "",
        ),
        ("in the worker p50, batch fetched -> decisions sent", f"{med('worker_p50_ms'):.1f} ms", ""),
        ("in the worker p99, batch fetched -> decisions sent", f"{med('worker_p99_ms'):.1f} ms", ""),
        ("decision latency p50, request in log -> decided", f"{med('decision_p50_ms'):.1f} ms", ""),
        (
            "decision latency p99, request in log -> decided",
            f"{med('decision_p99_ms'):.1f} ms",
            "target p99 <= 20 ms",
        ),
        ("publisher p50, request ts -> request in log", f"{med('publish_p50_ms'):.1f} ms", ""),
        ("publisher p99, request ts -> request in log", f"{med('publish_p99_ms'):.1f} ms", ""),
        ("latency p50, request ts -> decision created", f"{med('created_p50_ms'):.1f} ms", ""),
        ("latency p99, request ts -> decision created", f"{med('created_p99_ms'):.1f} ms", ""),
        ("latency p50, request ts -> decision consumed", f"{med('e2e_p50_ms'):.1f} ms", ""),
        ("latency p99, request ts -> decision consumed", f"{med('e2e_p99_ms'):.1f} ms", ""),
        ("in-policy decision latency p50 (per request)", f"{med('policy_p50_us'):.1f} us", ""),
        ("in-policy decision latency p99 (per request)", f"{med('policy_p99_us'):.1f} us", ""),
        ("requests per policy call (batch), mean", f"{med('mean_batch'):.0f}", ""),
    ]
    lines = [
        "",
        f"streaming benchmark: policy {args.policy}, {args.requests} requests per run, "
        f"feedback {'on' if args.feedback else 'off'}, publisher batches every {args.publisher_linger_ms} ms "
        f"in the latency phase, {'a new' if args.fresh_broker else 'one'} broker and worker "
        f"{'per run' if args.fresh_broker else 'for all runs'}, {os.cpu_count()} CPUs",
        f"{'':48}{label:>18}   reference (issue 3)",
        *(f"{name:48}{value:>18}   {ref}".rstrip() for name, value, ref in rows),
    ]
    return "\n".join(lines)


def _figure(figures: RunFigures, name: str) -> float:
    """A figure by (dotted) name, e.g. ``latency_cpu.worker``."""
    value: Any = figures
    for part in name.split("."):
        value = getattr(value, part)
    return float(value)


def run(args: argparse.Namespace) -> int:
    """All runs on one broker and worker, or (``--fresh-broker``) each run on new ones."""
    data_dir = Path(tempfile.mkdtemp(prefix="tokenfleet-bench-"))
    sessions = [range(i, i + 1) for i in range(args.repeat)] if args.fresh_broker else [range(args.repeat)]
    results: list[RunFigures] = []
    try:
        for runs in sessions:
            figures = session(args, data_dir, runs)
            if figures is None:
                return 1
            results += figures
        print(format_summary(args, results))
        return 0
    finally:
        if args.keep:
            _log(f"kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


def session(args: argparse.Namespace, data_dir: Path, runs: range) -> list[RunFigures] | None:
    """Start a broker and a worker, measure ``runs`` on them, stop both; None if it failed."""
    settings = Settings(
        data_dir=data_dir,
        policy=args.policy,
        app_id=f"bench-{os.getpid()}-{time.time_ns()}",
        worker_web_port=free_port(),
        clickhouse_dsn="" if args.feedback else "off",
    )
    with embedded_broker(log_path=data_dir / "tansu.log") as bootstrap:
        ensure_topics(bootstrap, settings.topic_partitions)
        _log(f"broker {bootstrap}; worker {settings.app_id} (policy {args.policy}), data {data_dir}")
        worker = start_worker(bootstrap, settings, args.feedback, args.worker_env)
        profiler = None
        try:
            if args.profile:
                profiler = _start_profiler(worker.pid, args.profile)
            return asyncio.run(orchestrate(args, bootstrap, settings, worker, runs))
        except Exception as exc:
            _log(f"failed: {exc}")
            _log("worker log tail:\n" + worker.log())
            return None
        finally:
            code = worker.stop()
            if profiler is not None:
                profiler.wait(timeout=30)
            _log(f"worker stopped (exit code {code})")


def _start_profiler(pid: int, out: str) -> subprocess.Popen[bytes]:
    """py-spy on the worker for its whole life (it stops when the worker exits)."""
    binary = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    kind = "raw" if out.endswith((".txt", ".folded")) else "flamegraph"  # raw: collapsed stacks
    return subprocess.Popen(
        [
            binary,
            "record",
            "--pid",
            str(pid),
            "--output",
            out,
            "--format",
            kind,
            "--rate",
            "200",
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=50_000, help="requests in the throughput phase")
    parser.add_argument("--policy", default="round-robin", help="routing policy of the worker")
    parser.add_argument("--feedback", action="store_true", help="ClickHouse feedback sink on (tmp dir)")
    parser.add_argument("--repeat", type=int, default=1, help="runs; figures are their median")
    parser.add_argument(
        "--fresh-broker",
        action="store_true",
        help="each run on a new broker and worker (the embedded broker slows down as its log grows)",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the latency phase")
    parser.add_argument("--rate-share", type=float, default=0.5, help="latency rate / measured rate")
    parser.add_argument(
        "--publisher-linger-ms",
        type=int,
        default=5,
        help="the latency phase sends what is due every N ms (at least 1) as one batch; see above",
    )
    parser.add_argument("--warmup", type=int, default=1000, help="requests routed before measuring")
    parser.add_argument("--stall", type=float, default=15.0, help="give up after this long with no decision")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--profile", metavar="SVG", help="py-spy the (last) worker into SVG (.txt: raw stacks)"
    )
    parser.add_argument(
        "--worker-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra worker setting, e.g. TOKENFLEET_REQUEST_FETCH_MAX_WAIT_MS=5 (repeatable)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the data dir (worker and broker logs)")
    args = parser.parse_args(argv)
    if args.requests < 1 or args.repeat < 1 or args.seconds <= 0 or not 0 < args.rate_share <= 1:
        parser.error("--requests and --repeat must be >= 1, --seconds > 0, 0 < --rate-share <= 1")
    if args.publisher_linger_ms < 0:
        parser.error("--publisher-linger-ms must be >= 0")
    if any("=" not in item for item in args.worker_env):
        parser.error("--worker-env takes KEY=VALUE")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
