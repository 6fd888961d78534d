"""Helpers for tests that run real worker processes against the session's embedded broker.

Topics are shared by the whole session, so every test uses a model pool (the message key) and
request ids of its own and filters what it reads by them.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from lab.worker_process import WorkerProcess
from schemas.codec import encode
from schemas.events import Event, Heartbeat, InferenceRequest
from schemas.topics import TopicSpec, key_of

ROOT = Path(__file__).resolve().parents[2]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def worker(
    bootstrap: str,
    app_id: str,
    data_dir: Path,
    clickhouse: str = "off",
    settings: dict[str, str] | None = None,
) -> WorkerProcess:
    """A worker subprocess with its own app id (consumer group) and data dir, any free port."""
    return WorkerProcess(
        bootstrap,
        data_dir,
        {
            "TOKENFLEET_APP_ID": app_id,
            "TOKENFLEET_CLICKHOUSE_DSN": clickhouse,
            "TOKENFLEET_WORKER_WEB_PORT": "0",
            "TOKENFLEET_POLICY": "least-request",
            **(settings or {}),
        },
        loglevel="info",
    )


def heartbeat(pool: str, instance: str, waiting: int = 0, dc: str = "dc-1") -> Heartbeat:
    return Heartbeat(
        instance_id=instance,
        dc=dc,
        model=pool,
        model_version="1",
        profile="llama3-8b-h100",
        waiting=waiting,
        running=0,
        tokens_in_flight=0,
        kv_blocks_used=0,
        kv_blocks_total=820,
    )


def request(pool: str, request_id: str) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id, model=pool, input_tokens=1000, output_budget=128, prompt_block_hashes=(1, 2)
    )


async def publish(bootstrap: str, spec: TopicSpec, events: Iterable[Event | tuple[bytes, bytes]]) -> None:
    """Send events (or raw ``(key, value)`` pairs) in order and wait until the broker has them."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for event in events:
            if isinstance(event, tuple):
                key, value = event
            else:
                key, value = key_of(spec, event), encode(event)
            await producer.send_and_wait(spec.name, value, key=key)
    finally:
        await producer.stop()


class Collector:
    """Reads a topic from the beginning in the background, keeping messages with one of ``keys``."""

    def __init__(self, bootstrap: str, spec: TopicSpec, *keys: bytes) -> None:
        self.bootstrap, self.spec, self.keys = bootstrap, spec, set(keys)
        self.values: list[bytes] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Collector:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        consumer = AIOKafkaConsumer(
            self.spec.name,
            bootstrap_servers=self.bootstrap,
            group_id=None,  # no group: plain assignment of all partitions, from the start
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            while not self._stop.is_set():
                batch = await consumer.getmany(timeout_ms=100)
                for messages in batch.values():
                    self.values += [m.value for m in messages if m.key in self.keys]
        finally:
            await consumer.stop()

    async def wait_for(self, count: int, timeout_s: float = 30.0) -> list[bytes]:
        deadline = time.monotonic() + timeout_s
        while len(self.values) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return list(self.values)
