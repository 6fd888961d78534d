"""Streaming benchmark: requests routed per second by one worker, end to end through the broker.

``python -m bench.stream [--requests N] [--policy NAME[,NAME...]] [--feedback] [--repeat K] [--fresh-broker]``

Starts the embedded broker, a ``tokenfleet worker`` subprocess (feedback sink off unless
``--feedback``), heartbeats for 8 ``llama3-8b`` instances, and a counting consumer of its own
that has joined and fixed its offsets before anything is published. Each policy of ``--policy``
(default ``round-robin,tokenpilot``) gets its own worker and broker, one after the other (with
``--fresh-broker``, run by run in turn, so the policies share the machine's good and bad
moments); the last lines give each later policy's routed rate as a share of the first's. Then,
per run:

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
Figures go to stdout, progress to stderr. The stack (broker, worker, the instances' heartbeats,
the counting consumer) is the lab's (``lab.stack``); one run's measurement is ``bench.stream_run``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from bench.stream_run import (
    DecisionCounter,
    RequestFactory,
    RunFigures,
    idle_instances,
    log,
    one_run,
    publish_all,
)
from infra.kafka.broker import free_port
from infra.kafka.clients import start_client
from infra.settings import Settings
from lab.stack import Stack, StaticFleet, WorkerOptions
from lab.worker_process import WorkerProcess

REFERENCE = (
    ("bare aiokafka relay (consume, decode, encode, produce)", "~46 000 msg/s"),
    ("minimal Faust relay", "~4 900 msg/s"),
    ("target, one worker", ">= 10 000 routed/s, p99 decision latency <= 20 ms at half rate"),
)


async def orchestrate(
    args: argparse.Namespace,
    bootstrap: str,
    settings: Settings,
    worker: WorkerProcess,
    runs: range,
) -> list[RunFigures]:
    counter = DecisionCounter(bootstrap)
    fleet = StaticFleet(bootstrap, idle_instances, settings.heartbeat_interval_s)
    await fleet.start()
    factory = RequestFactory(seed=args.seed)
    try:
        await counter.start()
        await worker.wait_ready_async(timeout_s=90)
        await asyncio.sleep(2.0)  # heartbeats reached the instance-state table
        log("worker ready; warm-up")
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
        await fleet.stop()
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


def format_comparison(results: dict[str, list[RunFigures]]) -> str:
    """Each policy's median routed rate and worker CPU per request against the first policy's."""
    (first, base), *others = results.items()

    def med(runs: Sequence[RunFigures], name: str) -> float:
        return float(statistics.median(_figure(r, name) for r in runs))

    lines = []
    rate, cpu = med(base, "routed_per_s"), med(base, "worker_cpu_us_per_request")
    for policy, runs in others:
        lines.append(
            f"{policy} routed {med(runs, 'routed_per_s'):,.0f} req/s = "
            f"{med(runs, 'routed_per_s') / rate:.0%} of {first}'s {rate:,.0f} req/s (worker CPU per "
            f"request {med(runs, 'worker_cpu_us_per_request'):.0f} against {cpu:.0f} us)"
        )
    return "\n".join(lines)


def format_summary(args: argparse.Namespace, policy: str, results: Sequence[RunFigures]) -> str:
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
        f"streaming benchmark: policy {policy}, {args.requests} requests per run, "
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
    """All runs of a policy on one broker and worker, or (``--fresh-broker``) each run on new
    ones, the policies taking turns."""
    data_dir = Path(tempfile.mkdtemp(prefix="tokenfleet-bench-"))
    if args.fresh_broker:
        sessions = [(policy, range(i, i + 1)) for i in range(args.repeat) for policy in args.policies]
    else:
        sessions = [(policy, range(args.repeat)) for policy in args.policies]
    results: dict[str, list[RunFigures]] = {policy: [] for policy in args.policies}
    try:
        for policy, runs in sessions:
            figures = session(args, policy, data_dir, runs)
            if figures is None:
                return 1
            results[policy] += figures
        for policy, figures in results.items():
            print(format_summary(args, policy, figures))
        if len(results) > 1:
            print("\n" + format_comparison(results))
        return 0
    finally:
        if args.keep:
            log(f"kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


def session(args: argparse.Namespace, policy: str, data_dir: Path, runs: range) -> list[RunFigures] | None:
    """Start a broker and a worker for ``policy``, measure ``runs`` on them, stop both; None if
    it failed."""
    settings = Settings(
        data_dir=data_dir,
        policy=policy,
        app_id=f"bench-{os.getpid()}-{time.time_ns()}",
        worker_web_port=free_port(),
        clickhouse_dsn="" if args.feedback else "off",
    )
    return asyncio.run(_session(args, settings, runs))


async def _session(args: argparse.Namespace, settings: Settings, runs: range) -> list[RunFigures] | None:
    worker_options = WorkerOptions(
        policy=settings.policy,
        clickhouse=settings.clickhouse_url if args.feedback else "off",
        web_port=settings.worker_web_port,
        app_id=settings.app_id,
        partitions=settings.topic_partitions,
        env=dict(item.split("=", 1) for item in args.worker_env),
    )
    async with Stack(settings.data_dir, partitions=settings.topic_partitions, worker=worker_options) as stack:
        bootstrap = await stack.start_broker()
        log(
            f"broker {bootstrap}; worker {settings.app_id} (policy {settings.policy}), "
            f"data {settings.data_dir}"
        )
        worker = stack.start_worker(log_path=settings.data_dir / "worker.log")
        profiler = None
        try:
            if args.profile:
                profiler = start_profiler(worker.pid, profile_path(args, settings.policy))
            return await orchestrate(args, bootstrap, settings, worker, runs)
        except Exception as exc:
            log(f"failed: {exc}")
            log("worker log tail:\n" + worker.log())
            return None
        finally:
            code = await stack.stop_worker(worker)
            if profiler is not None:
                await asyncio.to_thread(profiler.wait, 30)
            log(f"worker stopped (exit code {code})")


def profile_path(args: argparse.Namespace, policy: str) -> str:
    """``--profile``'s file, or with several policies one per policy (``out-tokenpilot.svg``)."""
    if len(args.policies) == 1:
        return str(args.profile)
    path = Path(args.profile)
    return str(path.with_name(f"{path.stem}-{policy.replace('+', '_')}{path.suffix}"))


def start_profiler(pid: int, out: str) -> subprocess.Popen[bytes]:
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
            "--subprocesses",  # the worker decides in its supervisor's child
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=50_000, help="requests in the throughput phase")
    parser.add_argument(
        "--policy",
        default="round-robin,tokenpilot",
        help="routing policies, comma-separated: each on its own worker; the later ones' routed rate "
        "is compared with the first's",
    )
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
        "--profile",
        metavar="SVG",
        help="py-spy the (last) worker into SVG (.txt: raw stacks); with several policies, one file each",
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
    args.policies = list(dict.fromkeys(p.strip() for p in args.policy.split(",") if p.strip()))
    if not args.policies:
        parser.error("--policy names at least one policy")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
