"""Benchmark: two workers deciding for one hot pool, against one (``make bench-stream``).

``python -m bench.stream_pair [--requests N] [--policy NAME] [--repeat K]``

One embedded broker, heartbeats for 8 idle ``llama3-8b`` instances (``bench.stream_run``), one
pool. The requests (about 8k input tokens, 15-20 prompt blocks sharing prefixes, 16 tenants)
are published as fast as aiokafka batches them, keyed by their affinity key
(``InferenceRequest.affinity_key``), so they spread over every partition of ``tf.requests``.

1. One worker: N requests; its routed rate (N / (last decision consumed - first published))
   and its CPU per request (CPU seconds of its process over the phase / requests it decided).
2. A second worker of the same app joins (the deciders' group gives it its share of the
   partitions); once both decide, N more requests. Per worker: the decisions it made, its share,
   its routed rate (its decisions / the phase) and its CPU per request; the pair's CPU per
   request (both processes' CPU / all decisions). Each worker also reads the other's
   placements (``tf.decisions``) and applies them to its own accounting: that is the pair's
   extra cost.

Printed per run, then the medians: the pair's CPU per request / one worker's (target within
15 %) and the larger worker's share of the decisions (target at most 60 %).

``--hot-prefix``: every request starts with one 8-block prefix (one affinity key), published
as a gateway would (``agents.affinity.HotPrefixes``: spread over the deciders once hot);
``--no-spread``: under its one key, so one worker decides everything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaProducer

from agents.affinity import HotPrefixes
from bench.stream import start_profiler
from bench.stream_run import DecisionCounter, RequestFactory, idle_instances, log, stamp
from infra.kafka.clients import start_client
from lab.measure import cpu_seconds
from lab.stack import Stack, StaticFleet, WorkerOptions
from lab.worker_process import WorkerProcess
from schemas.codec import decode
from schemas.events import InferenceRequest
from schemas.topics import REQUESTS


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase: decisions per worker (by its ``host:pid``), CPU seconds per worker, seconds."""

    decisions: dict[str, int]
    cpu_s: dict[str, float]
    seconds: float

    @property
    def total(self) -> int:
        return sum(self.decisions.values())

    def cpu_us_per_request(self) -> float:
        return 1e6 * sum(self.cpu_s.values()) / max(self.total, 1)

    def largest_share(self) -> float:
        return max(self.decisions.values(), default=0) / max(self.total, 1)


async def publish(producer: AIOKafkaProducer, factory: RequestFactory, run: str, count: int) -> float:
    """``count`` requests of ``run``, each keyed by its affinity key; when the first was sent."""
    payloads = factory.encoded(run, count)
    keys = [decode(InferenceRequest, stamp(parts, 0.0)).affinity_key.encode() for parts in payloads]
    first, pending = time.time(), []
    for parts, key in zip(payloads, keys, strict=True):
        pending.append(await producer.send(REQUESTS.name, stamp(parts, time.time()), key=key))
    await asyncio.gather(*pending)
    return first


async def phase(
    producer: AIOKafkaProducer,
    counter: DecisionCounter,
    factory: RequestFactory,
    run: str,
    count: int,
    workers: Sequence[WorkerProcess],
) -> Phase:
    pids = {f"{w.pid}": w.pid for w in workers}
    before = {pid: cpu_seconds(pid) for pid in pids.values()}
    counter.begin(run)
    first = await publish(producer, factory, run, count)
    await counter.wait_for(count, stall_s=10.0, limit_s=count / 200 + 60)
    cpu = {name: cpu_seconds(pid) - before[pid] for name, pid in pids.items()}
    decisions: Counter[str] = Counter()
    last = first
    for item in counter.received:
        decisions[json.loads(item.value)["worker"].rsplit(":", 1)[-1]] += 1
        last = max(last, item.consumed_s)
    return Phase(dict(decisions), cpu, last - first)


async def one_session(args: argparse.Namespace, data_dir: Path, index: int) -> tuple[Phase, Phase]:
    options = WorkerOptions(
        policy=args.policy, clickhouse="off", web_port=0, app_id=f"pair-{os.getpid()}-{index}"
    )
    async with Stack(data_dir, partitions=args.partitions, worker=options) as stack:
        bootstrap = await stack.start_broker()
        fleet = StaticFleet(bootstrap, idle_instances, 0.25)
        counter = DecisionCounter(bootstrap)
        await fleet.start()
        await counter.start()
        producer = await start_client(
            lambda: AIOKafkaProducer(
                bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=512 * 1024, acks=1
            ),
            "pair producer",
        )
        factory = RequestFactory(seed=args.seed + index, hot=_hot(args))
        profiler = None
        try:
            first = stack.start_worker(data_dir=data_dir / "first")
            await first.wait_ready_async(90)
            await asyncio.sleep(2.0)  # heartbeats reached it
            await phase(producer, counter, factory, f"warm{index}", args.warmup, [first])
            one = await phase(producer, counter, factory, f"one{index}", args.requests, [first])
            log(f"session {index}: one worker: {one}")
            second = stack.start_worker(data_dir=data_dir / "second")
            if args.profile and index == 0:
                profiler = start_profiler(second.pid, args.profile)
            await second.wait_ready_async(90)
            for attempt in range(30):  # until both decide (the group rebalanced)
                warm = await phase(producer, counter, factory, f"join{index}-{attempt}", 200, [first, second])
                if len(warm.decisions) == 2:
                    break
            pair = await phase(producer, counter, factory, f"pair{index}", args.requests, [first, second])
            log(f"session {index}: two workers: {pair}")
            return one, pair
        finally:
            await producer.stop()
            await counter.stop()
            await fleet.stop()
            if profiler is not None:  # py-spy writes its output once the worker exited
                await stack.stop_worker(second)
                await asyncio.to_thread(profiler.wait, 30)


def _hot(args: argparse.Namespace) -> HotPrefixes | None:
    """With ``--hot-prefix``: the publisher's spreading (none with ``--no-spread``)."""
    if not args.hot_prefix:
        return None
    return HotPrefixes(hot_rate_per_s=math.inf) if args.no_spread else HotPrefixes()


def report(one: Phase, pair: Phase) -> str:
    lines = [
        f"  one worker: {one.total} routed, {one.total / one.seconds:,.0f} req/s, "
        f"{one.cpu_us_per_request():.0f} us CPU per request"
    ]
    for name in sorted(pair.decisions):
        n = pair.decisions[name]
        lines.append(
            f"  worker {name}: {n} routed ({n / max(pair.total, 1):.0%}), {n / pair.seconds:,.0f} req/s, "
            f"{1e6 * pair.cpu_s.get(name, 0.0) / max(n, 1):.0f} us CPU per request"
        )
    lines.append(
        f"  the pair: {pair.total} routed, {pair.total / pair.seconds:,.0f} req/s, "
        f"{pair.cpu_us_per_request():.0f} us CPU per request "
        f"({pair.cpu_us_per_request() / one.cpu_us_per_request():.2f}x one worker's)"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_pair", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--requests",
        type=int,
        default=30_000,
        help="per phase (~4 s: what is still being read when it ends is little of it)",
    )
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--policy", default="tokenpilot")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="sessions, each on a new broker")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--hot-prefix", action="store_true", help="every request starts with one 8-block prefix"
    )
    parser.add_argument(
        "--no-spread", action="store_true", help="with --hot-prefix: publish it under one key (no spreading)"
    )
    parser.add_argument(
        "--profile", metavar="SVG", help="py-spy the second worker of session 0 (.svg; .txt: raw stacks)"
    )
    args = parser.parse_args(argv)
    if args.requests < 1 or args.repeat < 1 or args.warmup < 1:
        parser.error("--requests, --warmup and --repeat take positive numbers")
    ratios, shares = [], []
    root = Path(tempfile.mkdtemp(prefix="tokenfleet-pair-"))
    print(f"two workers on one hot pool: policy {args.policy}, {args.requests} requests per phase, "
          f"{args.partitions} partitions, {os.cpu_count()} CPUs")  # fmt: skip
    for index in range(args.repeat):
        one, pair = asyncio.run(one_session(args, root / f"s{index}", index))
        print(f"session {index}:\n{report(one, pair)}", flush=True)
        ratios.append(pair.cpu_us_per_request() / one.cpu_us_per_request())
        shares.append(pair.largest_share())
    print(
        f"median of {args.repeat}: the pair's CPU per request {statistics.median(ratios):.2f}x one worker's "
        f"(target <= 1.15); the larger worker's share {statistics.median(shares):.0%} (target <= 60 %)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
