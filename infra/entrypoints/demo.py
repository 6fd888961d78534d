"""``tokenfleet demo``: the whole control plane on one machine, end to end.

Starts the embedded broker, a worker process (which owns the embedded ClickHouse store), an
emulated fleet and a load generator over a real trace; shows progress; stops everything in
order (load -> drain -> fleet -> worker); then reads the summary back *from ClickHouse* (after
the worker stopped, since the embedded engine admits one process at a time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from infra.clickhouse.client import connect
from infra.clickhouse.summary import summary
from infra.entrypoints.fleet import run_fleet
from infra.entrypoints.loadgen import publish_workload
from infra.entrypoints.worker import ready_marker
from infra.kafka.broker import embedded_broker, ensure_topics
from infra.settings import Settings
from schemas.topics import COMPLETIONS, DECISIONS, DLQ, REQUESTS
from sim.workloads.sources import open_workload

_MALFORMED = (b"{not json", b'{"request_id": "bad-1", "model": "llama3-8b", "input_tokens": -5}')


class Counter:
    """Counts messages on the output topics, from a consumer group of its own."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.counts = {DECISIONS.name: 0, COMPLETIONS.name: 0, DLQ.name: 0}

    async def run(self, stop: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(
            *self.counts,
            bootstrap_servers=self.bootstrap,
            group_id=f"demo-monitor-{os.getpid()}-{time.time_ns()}",
            auto_offset_reset="latest",
            session_timeout_ms=6000,
            rebalance_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )
        await consumer.start()
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=200)
                for partition, messages in batch.items():
                    self.counts[partition.topic] += len(messages)
        finally:
            await consumer.stop()


async def _orchestrate(bootstrap: str, settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    workload = open_workload(args.workload, seed=0)
    counter = Counter(bootstrap)
    stop_counter, stop_fleet = asyncio.Event(), asyncio.Event()
    counter_task = asyncio.create_task(counter.run(stop_counter))
    fleet_ready = asyncio.Event()
    fleet_task = asyncio.create_task(
        run_fleet(
            bootstrap,
            args.fleet,
            speed=1.0,
            heartbeat_s=settings.heartbeat_interval_s,
            stop=stop_fleet,
            ready=fleet_ready,
        )
    )
    # Traffic starts when everyone listens: the monitor ("latest" offsets), the fleet and the
    # worker (partitions assigned, tables recovered), so TTFT measures scheduling, not start-up.
    await asyncio.wait_for(fleet_ready.wait(), timeout=60)
    await _wait_for(ready_marker(settings), timeout_s=90)
    await asyncio.sleep(2 * settings.heartbeat_interval_s + 3)  # heartbeats reached the worker
    await _send_malformed(bootstrap)
    load_task = asyncio.create_task(
        publish_workload(bootstrap, workload, rate_scale=args.rate_scale, duration_s=args.duration)
    )
    started = time.monotonic()
    while not load_task.done():
        await asyncio.wait({load_task}, timeout=2.0)
        _progress(time.monotonic() - started, args.duration, counter.counts)
    published = load_task.result()
    # Drain: give running requests time to finish (bounded by the longest client timeout).
    drain_until = time.monotonic() + 60
    while counter.counts[COMPLETIONS.name] < published and time.monotonic() < drain_until:
        await asyncio.sleep(1.0)
        _progress(time.monotonic() - started, args.duration, counter.counts)
    await asyncio.sleep(settings.feedback_flush_s + 1)  # last completions reach the worker's sink
    stop_fleet.set()
    await fleet_task
    stop_counter.set()
    await counter_task
    print(file=sys.stderr)
    return {
        "requests_published": published,
        "decisions": counter.counts[DECISIONS.name],
        "completions": counter.counts[COMPLETIONS.name],
        "dlq": counter.counts[DLQ.name],
    }


async def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not become ready within {timeout_s:.0f} s (see worker.log)")
        await asyncio.sleep(0.2)


async def _send_malformed(bootstrap: str) -> None:
    """Two bad events, to show they land in the dead-letter topic and nothing else stops."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for value in _MALFORMED:
            await producer.send_and_wait(REQUESTS.name, value, key=b"llama3-8b")
    finally:
        await producer.stop()


def _progress(elapsed: float, duration: float, counts: dict[str, int]) -> None:
    share = min(elapsed / max(duration, 1e-9), 1.0)
    bar = "#" * int(share * 30)
    sys.stderr.write(
        f"\r[demo] {bar:<30} {elapsed:5.0f}s  decisions {counts[DECISIONS.name]}"
        f"  completions {counts[COMPLETIONS.name]}  dlq {counts[DLQ.name]}   "
    )
    sys.stderr.flush()


def _start_worker(bootstrap: str, settings: Settings, policy: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TOKENFLEET_KAFKA_BOOTSTRAP": bootstrap,
        "TOKENFLEET_POLICY": policy,
        "TOKENFLEET_DATA_DIR": str(settings.data_dir),
        "TOKENFLEET_CLICKHOUSE_DSN": settings.clickhouse_url,
        # The configured metrics port if it is free, else any free one (see worker.log).
        "TOKENFLEET_WORKER_WEB_PORT": str(
            settings.worker_web_port if _port_free(settings.worker_web_port) else 0
        ),
    }
    log = (settings.data_dir / "worker.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "infra.entrypoints.cli", "worker"], env=env, stdout=log, stderr=log
    )


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_demo(settings: Settings, args: argparse.Namespace) -> int:
    """One demo per ``--policy`` (one after another, same load); with two or more, a comparison.

    The JSON is one run's summary, or ``{"runs": {policy: summary}}`` for several."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    policies = args.policy_names or ["round-robin"]
    results = {policy: _run_once(settings, args, policy) for policy in policies}
    if len(results) > 1:
        print(_compare(results))
    print(f"data: {settings.clickhouse_url} (query it with `tokenfleet sql`, see README)", file=sys.stderr)
    if args.json:
        document = next(iter(results.values())) if len(results) == 1 else {"runs": results}
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0 if all(r["decisions"] and r["completions"] for r in results.values()) else 1


def _run_once(settings: Settings, args: argparse.Namespace, policy: str) -> dict[str, Any]:
    since = time.time()
    print(f"demo: policy {policy}, fleet {args.fleet}, {args.duration:.0f} s of load", file=sys.stderr)
    with embedded_broker(log_path=settings.data_dir / "tansu.log") as bootstrap:
        ensure_topics(bootstrap, settings.topic_partitions)
        print(f"demo: embedded Kafka (Tansu) on {bootstrap}", file=sys.stderr)
        worker = _start_worker(bootstrap, settings, policy)
        try:
            counts = asyncio.run(_orchestrate(bootstrap, settings, args))
        finally:
            _stop(worker)
    client = connect(settings.clickhouse_url)
    try:
        result = {**counts, **summary(client, since_ts=since)}
    finally:
        client.close()
    print(_format(result, policy))
    return result


def _compare(results: dict[str, dict[str, Any]]) -> str:
    """Per class, each policy's TTFT p50 / p95 side by side."""
    lines = ["", "comparison (TTFT p50 / p95 s, read back from ClickHouse)"]
    classes = sorted({c for r in results.values() for c in r["per_class"]})
    lines.append(f"{'class':<14}" + "".join(f"{policy:>22}" for policy in results))
    for name in classes:
        cells = []
        for r in results.values():
            row = r["per_class"].get(name, {})
            p50, p95 = row.get("ttft_p50_s"), row.get("ttft_p95_s")
            cells.append(f"{_seconds(p50)} / {_seconds(p95)}")
        lines.append(f"{name:<14}" + "".join(f"{cell:>22}" for cell in cells))
    return "\n".join(lines)


def _format(result: dict[str, Any], policy: str) -> str:
    header = ("class", "completed", "TTFT p50", "TTFT p95", "goodput tok/s", "compliant")
    lines = [
        f"policy {policy}: published {result['requests_published']}, decisions {result['decisions']}, "
        f"completions {result['completions']}, dlq {result['dlq']}, "
        f"clickhouse rows {result['clickhouse_rows']}",
        "",
        f"{header[0]:<14}"
        + "".join(f"{h:>{w}}" for h, w in zip(header[1:], (10, 10, 10, 15, 11), strict=True)),
    ]
    for name, row in result["per_class"].items():
        p50, p95 = row.get("ttft_p50_s"), row.get("ttft_p95_s")
        lines.append(
            f"{name:<14}{row.get('completed', 0):>10}"
            f"{_seconds(p50):>10}{_seconds(p95):>10}"
            f"{row.get('goodput_tokens_per_s', 0.0):>15.1f}{row.get('compliant_share', 0.0):>11.1%}"
        )
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
