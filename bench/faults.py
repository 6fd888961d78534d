"""Fault suite: what the control plane does under bad input, crashes and outages, in figures.

``python -m bench.faults [--only NAME ...] [--json out/faults.json]`` (``make faults``)

Not a test: every scenario runs on a fresh embedded broker (Tansu) and a fresh data dir, with a
``tokenfleet worker`` subprocess (``lab.worker_process.WorkerProcess``, the
embedded ClickHouse store unless said otherwise), the emulated fleet ``2xllama3-8b-h100``
in this process (``dispatcher.service.run_fleet``), a publisher and one collector that
reads ``tf.decisions``, ``tf.admission``, ``tf.completions`` and ``tf.dlq`` from their start.
It prints one table row per scenario (stdout), progress on stderr, and with ``--json`` writes
``{"scenarios": {NAME: {...}}}``. A scenario that fails keeps its figures so far and gets an
``"error"``; the suite goes on. Every wait is bounded; every process started is stopped.

Scenarios: ``baseline`` (no fault: the reference p99), ``fuzz``, ``poison``, ``worker_kill``,
``store_down_at_start``, ``store_down_mid_run``, ``held_restart``, ``broker_restart`` (what
each does: the docstring of its function below).

How each figure is counted (``null`` where it does not apply):

- ``published``: valid requests the broker acknowledged (warm-up requests excluded; a send the
  broker never acknowledged was not published). Bad messages are ``bad_published``.
- ``decided_once`` / ``decided_twice``: routing decisions on ``tf.decisions`` per
  (request_id, attempt) of the valid requests published: how many keys got exactly one, how
  many two or more (distinct decision event ids: one record read twice is one decision).
- ``executed_twice``: (request_id, attempt) of valid requests with two or more completions
  (distinct event ids) on ``tf.completions``: the fleet ran the attempt more than once.
- ``lost``: valid requests published with neither a routing decision nor a ``reject`` on
  ``tf.admission``; after a broker restart only those the broker still serves at the end (what
  the broker itself lost is counted apart, see ``Run.broker_audit``).
- ``dead_lettered``: records on ``tf.dlq``; ``bad_not_dead_lettered`` counts the bad messages
  published whose SHA-256 no dead letter carries (the fuzz and poison scenarios), and
  ``valid_dead_lettered`` the valid requests that were dead-lettered.
- ``completions_stored``: distinct completion event ids in ClickHouse ``completions`` after the
  run (read once the last worker stopped: the embedded engine admits one process at a time);
  ``completions_expected``: distinct completion event ids seen on ``tf.completions`` (warm-up
  included: the store keeps those too).
- ``routing_p99_s``: p99 (nearest rank) of decision record timestamp - request record
  timestamp (the broker's acknowledgement metadata, CreateTime) over the valid requests
  published inside the scenario's fault window (below); a request never decided is left out
  (it is ``lost``).
- ``recovered_s``: first decision record timestamp after the end of the fault - that end.
  ``outage_s`` (worker_kill, broker_restart): the same from the *start* of the fault.

Extra figures where they apply: ``rejected`` (valid requests rejected), ``held_at_end`` (valid
requests never decided whose last admission answer is ``queue``: held, counted in ``lost``),
``send_failed`` (sends the broker never acknowledged), ``fleet_error`` / ``fleet_died_at_s``
(the in-process fleet stopped with an error, seconds into the scenario), ``outage_s``,
``completions_missing`` (seen on ``tf.completions``, not in the store), broker_restart's audit of
what the broker lost (``lost_with_broker_log``, ``lost_unserved_by_new_broker``,
``broker_offset_collisions``, ``decided_not_executed_unserved_by_new_broker``,
``completions_missing_with_broker_log``, ``completions_missing_unserved_by_new_broker``,
``completions_missing_at_broker_collisions``, ``decided_not_executed_at_broker_collisions`` (at
an offset where the new broker holds two records: a live consumer reads one and moves past the
other), ``completions_missing_with_broker_losses`` (all of them; ``completions_missing`` then
counts only what the system lost): see
``Run.broker_audit``), ``routing_p99_control_s`` / ``routing_p99_ratio`` / ``routing_p99_before_s`` /
``routing_p99_after_s`` (store_down_mid_run),
``decided_not_executed`` (decided valid requests with no completion on ``tf.completions``;
broker_restart also ``..._before_restart``: those decided on the old broker),
``spool_*`` (store_down_at_start, store_down_mid_run), ``decided_after_last_pill`` (poison),
``note`` (a scenario not run, and why), ``error`` (a scenario that failed: its figures are those so
far), ``seconds``.

Fault windows: ``baseline``, ``fuzz``, ``poison``: the publishing period (poison: its end is
the last pill's acknowledgement); ``worker_kill``: kill -9 -> the replacement is ready;
``held_restart``: first held request -> the fleet's first heartbeat after the restart;
``store_down_at_start``: first request -> the worker with the embedded store is ready;
``store_down_mid_run``: the store's calls start failing -> they succeed again;
``broker_restart``: the old broker stopped -> the new one listens with its topics.

After a broker restart the collector (the measuring apparatus, not the system under test)
starts a new consumer from offset 0 of the new log, keeping what it saw before; the publisher's
producer, the worker and the fleet are left to reconnect on their own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from dispatcher.service import run_fleet
from infra.clickhouse.client import connect
from infra.kafka.broker import embedded_broker, ensure_topics_async, free_port
from infra.kafka.clients import start_client
from lab.worker_process import WorkerProcess
from schemas.codec import DecodeError, decode, encode
from schemas.events import InferenceRequest
from schemas.topics import ADMISSION, COMPLETIONS, DECISIONS, DLQ, REQUESTS
from sim.evaluation.metrics import percentile

FLEET = "2xllama3-8b-h100"
MODEL = "llama3-8b"  # the pool of that fleet
PARTITIONS = 4
RATE_PER_S = 40.0  # steady valid traffic: far below what 2 emulated instances serve
MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # room for the 5 MB pill
SCENARIO_LIMIT_S = 600.0  # a scenario that runs longer is cancelled (its figures so far kept)
FIGURES = (
    "published",
    "decided_once",
    "decided_twice",
    "executed_twice",
    "lost",
    "dead_lettered",
    "completions_stored",
    "completions_expected",
    "routing_p99_s",
    "recovered_s",
)
Key = tuple[str, int]  # (request_id, attempt)


def _log(text: str) -> None:
    print(f"[faults] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- pure counting helpers


def tally(keys: Iterable[Key]) -> Counter[Key]:
    """How many times each (request_id, attempt) occurs."""
    return Counter(keys)


def once_and_twice(valid: Iterable[Key], seen: Mapping[Key, int]) -> tuple[int, int]:
    """Of the ``valid`` keys: how many were seen exactly once, how many twice or more."""
    once = twice = 0
    for key in set(valid):
        n = seen.get(key, 0)
        once += n == 1
        twice += n >= 2
    return once, twice


def count_lost(valid: Iterable[Key], decided: Iterable[Key], rejected: Iterable[Key]) -> int:
    """Valid keys with neither a decision nor a reject."""
    answered = set(decided) | set(rejected)
    return sum(1 for key in set(valid) if key not in answered)


def p99(values: Sequence[float]) -> float | None:
    """Nearest-rank 99th percentile (NaN skipped); None when there is nothing to rank."""
    return percentile(values, 99.0)


def window_latencies(
    published: Mapping[Key, float], first_decided: Mapping[Key, float], start: float, end: float
) -> list[float]:
    """Decision time - publish time of the keys published in [start, end] that were decided."""
    return [
        first_decided[key] - ts
        for key, ts in published.items()
        if start <= ts <= end and key in first_decided
    ]


def recovered_after(fault_end: float, decision_times: Iterable[float]) -> float | None:
    """Seconds from ``fault_end`` to the first decision strictly after it; None if none came."""
    after = [t for t in decision_times if t > fault_end]
    return min(after) - fault_end if after else None


def missing_digests(bad: Iterable[bytes], dead_letter_digests: Iterable[str]) -> int:
    """Bad messages (by SHA-256 of their bytes) that no dead letter describes."""
    have = set(dead_letter_digests)
    return sum(1 for raw in bad if hashlib.sha256(raw).hexdigest() not in have)


# ---------------------------------------------------------------- fuzzed and poison messages


def valid_request(rng: random.Random, request_id: str, **fields: Any) -> InferenceRequest:
    input_tokens = rng.randint(300, 2500)
    blocks = input_tokens // 512
    values: dict[str, Any] = {
        "request_id": request_id,
        "model": MODEL,
        "tenant": f"tenant-{rng.randrange(4)}",
        "input_tokens": input_tokens,
        "output_budget": rng.randint(4, 48),  # the emulated fleet generates the whole budget
        "prompt_block_hashes": tuple(rng.getrandbits(62) for _ in range(blocks)),
        "event_id": f"{rng.getrandbits(128):032x}",
    }
    values.update(fields)
    return InferenceRequest(**values)


def _mutations() -> list[Callable[[random.Random, dict[str, Any]], bytes]]:
    def random_bytes(rng: random.Random, base: dict[str, Any]) -> bytes:
        return rng.randbytes(rng.randint(0, 400))

    def truncated(rng: random.Random, base: dict[str, Any]) -> bytes:
        raw = json.dumps(base).encode()
        return raw[: rng.randint(0, len(raw) - 1)]

    def wrong_type(rng: random.Random, base: dict[str, Any]) -> bytes:
        name = rng.choice(["request_id", "model", "input_tokens", "output_budget", "attempt", "ts"])
        base[name] = rng.choice([[1, 2], {"a": 1}, True, None, "many", -3.5, ""])
        return json.dumps(base).encode()

    def huge_number(rng: random.Random, base: dict[str, Any]) -> bytes:
        name = rng.choice(
            ["input_tokens", "output_budget", "attempt", "ts", "deadline_ts", "prompt_block_hashes"]
        )
        raw = json.dumps({**base, name: 0}).encode()
        digits = "9" * rng.randint(12, 5000) if rng.random() < 0.5 else f"1e{rng.randint(20, 400)}"
        sign = "-" if rng.random() < 0.2 else ""
        return raw.replace(f'"{name}": 0'.encode(), f'"{name}": {sign}{digits}'.encode())

    def not_finite(rng: random.Random, base: dict[str, Any]) -> bytes:
        name = rng.choice(["input_tokens", "ts", "deadline_ts", "output_budget"])
        raw = json.dumps({**base, name: 0}).encode()
        token = rng.choice(["NaN", "Infinity", "-Infinity"])
        return raw.replace(f'"{name}": 0'.encode(), f'"{name}": {token}'.encode())

    def extra_field(rng: random.Random, base: dict[str, Any]) -> bytes:
        base[rng.choice(["x", "priority", "__proto__", "Model", "requestId"])] = rng.random()
        return json.dumps(base).encode()

    def missing_field(rng: random.Random, base: dict[str, Any]) -> bytes:
        base.pop(rng.choice(["request_id", "model", "input_tokens", "output_budget"]))
        return json.dumps(base).encode()

    def not_an_object(rng: random.Random, base: dict[str, Any]) -> bytes:
        return json.dumps(rng.choice([[base], 42, "request", None, [], True])).encode()

    def bad_utf8(rng: random.Random, base: dict[str, Any]) -> bytes:
        raw = json.dumps(base).encode()
        return raw.replace(b'"model": "', b'"model": "\xff\xfe', 1)

    return [
        random_bytes,
        truncated,
        wrong_type,
        huge_number,
        not_finite,
        extra_field,
        missing_field,
        not_an_object,
        bad_utf8,
    ]


def fuzzed_messages(count: int, seed: int = 0) -> list[bytes]:
    """``count`` seeded mutations of valid requests, each checked to be invalid (a mutation that
    happens to decode as a request is drawn again), so every one of them must be dead-lettered."""
    rng = random.Random(seed)
    mutations = _mutations()
    out: list[bytes] = []
    while len(out) < count:
        base = json.loads(encode(valid_request(rng, f"fuzz-{len(out)}", ts=1.7e9 + rng.random())))
        raw = rng.choice(mutations)(rng, base)
        try:
            decode(InferenceRequest, raw)
        except DecodeError:
            out.append(raw)
    return out


def poison_pills(rng: random.Random) -> dict[str, bytes]:
    """The named poison pills: bounded fields pushed far out of range, and a 5 MB message."""

    def with_raw(name: str, literal: str) -> bytes:
        raw = json.dumps({**json.loads(encode(valid_request(rng, f"pill-{name}"))), name: 0}).encode()
        return raw.replace(f'"{name}": 0'.encode(), f'"{name}": {literal}'.encode())

    huge = json.loads(encode(valid_request(rng, "pill-5mb")))
    huge["prompt_block_hashes"] = [rng.getrandbits(62) for _ in range(270_000)]  # > MAX_BLOCK_HASHES
    pills = {
        "attempt_1e6": with_raw("attempt", "1000000"),
        "input_tokens_1e12": with_raw("input_tokens", "1000000000000"),
        "deadline_ts_nan": with_raw("deadline_ts", "NaN"),
        "deadline_ts_1e20": with_raw("deadline_ts", "1e20"),
        "ts_1e20": with_raw("ts", "1e20"),
        "5mb": json.dumps(huge).encode(),
    }
    for name, raw in pills.items():
        try:
            decode(InferenceRequest, raw)
        except DecodeError:
            continue
        raise AssertionError(f"the poison pill {name} decodes as a valid request")
    return pills


# ---------------------------------------------------------------- broker clients


@dataclass(frozen=True, slots=True)
class Decided:
    key: Key
    at: float  # the decision record's timestamp, seconds
    worker: str
    event_id: str


class Collector:
    """Reads the decision, admission, completion and dead-letter topics from their start (no
    consumer group: every partition), keeping what the figures need. Survives a broker restart
    as far as aiokafka does (out-of-range offsets on a new, empty log reset to the earliest)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.decisions: list[Decided] = []
        self.admissions: list[tuple[Key, str]] = []
        self.completions: list[tuple[Key, str, str]] = []  # key, event id, status
        self.dead_letters: list[tuple[str, str, str]] = []  # sha256, source topic, reason
        self.undecodable = 0
        self.completions_before_restart = 0  # completions read from the broker before its restart
        self.error = ""
        self._task: asyncio.Task[None] | None = None
        self._consumer: Any = None

    async def start(self) -> None:
        self._consumer = await start_client(
            lambda: AIOKafkaConsumer(
                DECISIONS.name,
                ADMISSION.name,
                COMPLETIONS.name,
                DLQ.name,
                bootstrap_servers=self.bootstrap,
                group_id=None,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                fetch_max_wait_ms=50,
                max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
                fetch_max_bytes=4 * MAX_MESSAGE_BYTES,
            ),
            "fault collector",
        )
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            while True:
                batch = await self._consumer.getmany(timeout_ms=200, max_records=5000)
                for partition, records in batch.items():
                    for record in records:
                        self._keep(partition.topic, record.value, record.timestamp / 1e3)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.error = f"collector: {type(exc).__name__}: {exc}"
            _log(self.error)

    def _keep(self, topic: str, value: bytes | None, at: float) -> None:
        try:
            data = json.loads(value or b"")
            if topic == DECISIONS.name:
                self.decisions.append(
                    Decided(
                        (data["request_id"], data["attempt"]), at, data.get("worker", ""), data["event_id"]
                    )
                )
            elif topic == ADMISSION.name:
                self.admissions.append(((data["request_id"], data["attempt"]), data["action"]))
            elif topic == COMPLETIONS.name:
                key = (data["request_id"], data["attempt"])
                self.completions.append((key, data["event_id"], data["status"]))
            elif topic == DLQ.name:
                self.dead_letters.append((data["original_sha256"], data["source_topic"], data["reason"]))
        except (ValueError, KeyError, TypeError):
            self.undecodable += 1

    def decided(self, keys: set[Key]) -> int:
        return len({d.key for d in self.decisions if d.key in keys})

    def answered_admissions(self, keys: set[Key]) -> int:
        return len({key for key, _ in self.admissions if key in keys})

    def completed(self, keys: set[Key]) -> int:
        return len({key for key, _, _ in self.completions if key in keys})

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._consumer.stop(), timeout=10)

    async def restart(self) -> None:
        """A new consumer from the start of every partition, keeping what was seen: after a
        broker restart the new log starts again at offset 0, and an old consumer whose position
        the new log has already passed would skip its first records (the collector is the
        measuring apparatus; it must not miss what the system did)."""
        await self.stop()
        self.completions_before_restart = len(self.completions)
        self._task, self._consumer, self.error = None, None, ""
        await self.start()


class Publisher:
    """One producer; remembers each acknowledged valid request's record timestamp (and on which
    broker incarnation it was acknowledged), the bad messages and the sends that failed."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.valid: dict[Key, float] = {}  # acknowledged valid requests -> record timestamp (s)
        self.acked_at: dict[Key, float] = {}  # -> time.time() when the acknowledgement came
        self.bad: list[bytes] = []  # bad messages acknowledged
        self.valid_digests: set[str] = set()  # SHA-256 of every counted valid request sent
        self.failed = 0  # sends the broker never acknowledged
        self._pending: set[asyncio.Future[Any]] = set()
        self._producer: Any = None

    async def start(self) -> None:
        self._producer = await start_client(
            lambda: AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                linger_ms=5,
                max_request_size=MAX_MESSAGE_BYTES,
                request_timeout_ms=10_000,
                acks=1,
            ),
            "fault publisher",
        )

    def send(
        self, value: bytes, key: bytes | None = MODEL.encode(), valid: Key | None = None, bad: bool = True
    ) -> None:
        """Queue one message (never blocks the caller); its acknowledgement is recorded later.
        ``valid``: the key of a counted valid request; else a bad message (unless ``bad=False``)."""
        task: asyncio.Future[Any] = asyncio.ensure_future(self._send(value, key, valid, bad))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _send(self, value: bytes, key: bytes | None, valid: Key | None, bad: bool) -> None:
        try:
            delivery = await asyncio.wait_for(self._producer.send(REQUESTS.name, value, key=key), timeout=15)
            metadata = await asyncio.wait_for(delivery, timeout=30)
        except Exception:
            self.failed += 1
            return
        if valid is None:
            if bad:
                self.bad.append(value)
        else:
            self.valid[valid] = metadata.timestamp / 1e3
            self.acked_at[valid] = time.time()

    def request(self, request: InferenceRequest, counted: bool = True) -> None:
        """Send a valid request; ``counted=False`` (warm-up): not one of the figures' requests."""
        raw = encode(request)
        if counted:
            self.valid_digests.add(hashlib.sha256(raw).hexdigest())
            self.send(raw, request.model.encode(), (request.request_id, request.attempt))
        else:
            self.send(raw, request.model.encode(), None, bad=False)

    async def flush(self, timeout_s: float = 40.0) -> None:
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)

    async def stop(self) -> None:
        await self.flush(20)
        for task in list(self._pending):
            task.cancel()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._producer.stop(), timeout=10)


@dataclass
class BrokerLog:
    """What a broker serves, read from offset 0 of every partition: the keys of the requests
    and decisions, the completion event ids, and how many offsets hold more than one record."""

    request_keys: set[Key] = field(default_factory=set)
    decision_keys: set[Key] = field(default_factory=set)
    completion_ids: set[str] = field(default_factory=set)
    collisions: int = 0
    collided_decision_keys: set[Key] = field(default_factory=set)  # at an offset holding two records
    collided_completion_ids: set[str] = field(default_factory=set)

    @classmethod
    async def read(cls, bootstrap: str, idle_s: float = 2.0) -> BrokerLog:
        served = cls()
        consumer = await start_client(
            lambda: AIOKafkaConsumer(
                REQUESTS.name,
                DECISIONS.name,
                COMPLETIONS.name,
                bootstrap_servers=bootstrap,
                group_id=None,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
                max_partition_fetch_bytes=MAX_MESSAGE_BYTES,
                fetch_max_bytes=4 * MAX_MESSAGE_BYTES,
            ),
            "fault audit",
        )
        offsets: Counter[tuple[str, int, int]] = Counter()
        at: dict[tuple[str, int, int], list[Key | str]] = {}
        try:
            while batch := await consumer.getmany(timeout_ms=int(idle_s * 1000), max_records=5000):
                for tp, records in batch.items():
                    for record in records:
                        where = (tp.topic, tp.partition, record.offset)
                        offsets[where] += 1
                        kept = served._keep(tp.topic, record.value)
                        if kept is not None:
                            at.setdefault(where, []).append(kept)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), timeout=10)
        served.collisions = sum(1 for n in offsets.values() if n > 1)
        # A live consumer reads one of the records at a collided offset and moves past the
        # other: those are the broker's to answer for, like the records it does not serve.
        for where, n in offsets.items():
            if n > 1 and where[0] != REQUESTS.name:
                for kept in at.get(where, []):
                    if isinstance(kept, str):
                        served.collided_completion_ids.add(kept)
                    else:
                        served.collided_decision_keys.add(kept)
        return served

    def _keep(self, topic: str, value: bytes | None) -> Key | str | None:
        """Record what ``value`` is; return its completion id or (request id, attempt)."""
        try:
            data = json.loads(value or b"")
            if topic == COMPLETIONS.name:
                self.completion_ids.add(data["event_id"])
                return str(data["event_id"])
            keys = self.request_keys if topic == REQUESTS.name else self.decision_keys
            key = (data["request_id"], data["attempt"])
            keys.add(key)
            return key
        except (ValueError, KeyError, TypeError):
            return None  # a bad request: the fuzz scenarios count those, not the audit


# ---------------------------------------------------------------- one scenario's run


@dataclass
class Run:
    """Everything one scenario starts, and what it measured; ``close`` stops it all."""

    name: str
    data_dir: Path
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    bootstrap: str = ""
    collector: Collector | None = None
    publisher: Publisher | None = None
    workers: list[WorkerProcess] = field(default_factory=list)
    app_id: str = ""
    window: tuple[float, float] | None = None  # the fault window (time.time()), for routing_p99_s
    fault_start: float | None = None  # for outage_s
    fault_end: float | None = None  # for recovered_s
    broker_stopped_at: float | None = None  # for lost_with_broker_log
    served: BrokerLog | None = None  # what the (new) broker serves at the end, for the audit
    extra: dict[str, Any] = field(default_factory=dict)
    store: bool = True  # read completions back from the embedded store
    _broker: Any = None
    _fleet: asyncio.Task[Any] | None = None
    _fleet_stop: asyncio.Event | None = None
    _seq: int = 0
    started_at: float = field(default_factory=time.time)

    # --- lifecycle

    async def start_broker(self, port: int | None = None) -> None:
        """A fresh embedded broker (on ``port`` if given: a restart) with the project's topics."""
        manager = embedded_broker(log_path=self.data_dir / f"tansu-{time.time_ns()}.log", port=port)
        self.bootstrap = manager.__enter__()
        self._broker = manager
        await ensure_topics_async(self.bootstrap, PARTITIONS)

    def stop_broker(self) -> None:
        if self._broker is not None:
            manager, self._broker = self._broker, None
            manager.__exit__(None, None, None)

    async def start_clients(self) -> None:
        self.collector = Collector(self.bootstrap)
        await self.collector.start()
        self.publisher = Publisher(self.bootstrap)
        await self.publisher.start()

    def start_worker(self, dsn: str = "", **settings: str) -> WorkerProcess:
        """A worker on the shared data dir: ``dsn`` "" = the embedded store there."""
        self._seq += 1
        self.app_id = self.app_id or f"faults-{self.name}-{os.getpid()}"
        worker = WorkerProcess(
            self.bootstrap,
            self.data_dir,
            {
                "TOKENFLEET_APP_ID": self.app_id,
                "TOKENFLEET_CLICKHOUSE_DSN": dsn,
                "TOKENFLEET_WORKER_WEB_PORT": "0",
                "TOKENFLEET_TOPIC_PARTITIONS": str(PARTITIONS),
                "TOKENFLEET_POLICY": "least-request",
                **settings,
            },
            log_path=self.data_dir / f"worker-{self._seq}.log",
            loglevel="info",
        )
        self.workers.append(worker)
        return worker

    async def stop_worker(self, worker: WorkerProcess, kill: bool = False) -> int:
        code = await asyncio.to_thread(worker.stop, kill)
        _log(f"{self.name}: worker {worker.pid} {'killed' if kill else 'stopped'} (exit {code})")
        return code

    async def start_fleet(self, timeout_s: float = 40.0) -> None:
        self._fleet_stop, ready = asyncio.Event(), asyncio.Event()
        self._fleet = asyncio.create_task(
            run_fleet(
                self.bootstrap, FLEET, stop=self._fleet_stop, ready=ready, group_id=f"fleet-{self.app_id}"
            )
        )
        self._fleet.add_done_callback(self._fleet_ended)
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({waiter, self._fleet}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._fleet.done():
            self._fleet.result()  # raises its error
            raise RuntimeError("the fleet stopped before it was ready")
        if not ready.is_set():
            raise RuntimeError(f"the fleet got no partition within {timeout_s:.0f} s")

    def _fleet_ended(self, task: asyncio.Task[Any]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self.extra["fleet_error"] = f"{type(error).__name__}: {error}"[:300]
            self.extra["fleet_died_at_s"] = round(time.time() - self.started_at, 1)
            _log(f"{self.name}: the fleet stopped with {self.extra['fleet_error']}")

    async def stop_fleet(self) -> None:
        if self._fleet is None or self._fleet_stop is None:
            return
        fleet, self._fleet = self._fleet, None
        self._fleet_stop.set()
        done, _ = await asyncio.wait({fleet}, timeout=15)
        if not done:
            fleet.cancel()
            await asyncio.wait({fleet}, timeout=10)

    async def close(self) -> None:
        """Stop everything this run started, in order; never raises."""
        steps: list[Callable[[], Awaitable[Any]]] = []
        if self.publisher is not None:
            steps.append(self.publisher.stop)
        steps.append(self.stop_fleet)
        steps += [functools.partial(self.stop_worker, w) for w in self.workers if w.process.poll() is None]
        if self.collector is not None:
            steps.append(self.collector.stop)
        for step in steps:
            try:
                await asyncio.wait_for(step(), timeout=60)
            except Exception as exc:
                _log(f"{self.name}: cleanup step failed: {type(exc).__name__}: {exc}")
        for worker in self.workers:  # closed their log files even when they had exited
            with contextlib.suppress(Exception):
                await asyncio.to_thread(worker.stop)
        with contextlib.suppress(Exception):
            self.stop_broker()

    # --- traffic and waits

    def valid(self, prefix: str, i: int, **fields: Any) -> InferenceRequest:
        return valid_request(self.rng, f"{self.name}-{prefix}-{i}", **fields)

    async def steady(
        self, prefix: str, seconds: float, rate: float = RATE_PER_S, start_index: int = 0
    ) -> int:
        """Valid requests at ``rate`` for ``seconds`` (sends never block the pace); returns the
        next index."""
        assert self.publisher is not None
        start, i = time.monotonic(), start_index
        while (elapsed := time.monotonic() - start) < seconds:
            due = start_index + int(elapsed * rate) + 1
            while i < due:
                self.publisher.request(self.valid(prefix, i))
                i += 1
            await asyncio.sleep(0.01)
        return i

    async def warm_up(self, count: int = 20, timeout_s: float = 40.0) -> None:
        """Requests that are not counted, until they are decided: the worker sees the fleet."""
        assert self.publisher is not None and self.collector is not None
        ids = [valid_request(self.rng, f"{self.name}-warmup-{i}") for i in range(count)]
        for request in ids:
            self.publisher.request(request, counted=False)
        keys = {(r.request_id, r.attempt) for r in ids}
        await self.until(
            lambda: self.collector is not None and self.collector.decided(keys) >= count, timeout_s
        )
        if self.collector.decided(keys) < count:
            raise RuntimeError(
                f"warm-up: {self.collector.decided(keys)} of {count} routed in {timeout_s:.0f} s"
            )

    async def until(
        self,
        done: Callable[[], bool],
        timeout_s: float,
        stall_s: float | None = None,
        progress: Callable[[], int] | None = None,
    ) -> bool:
        """Poll ``done`` until true, ``timeout_s`` passed, or (with ``progress``) it stalled for
        ``stall_s``; returns whether it came true."""
        deadline = time.monotonic() + timeout_s
        last, last_change = -1, time.monotonic()
        while not done():
            now = time.monotonic()
            if now > deadline:
                return False
            if progress is not None and stall_s is not None:
                value = progress()
                if value != last:
                    last, last_change = value, now
                elif now - last_change > stall_s:
                    return False
            await asyncio.sleep(0.1)
        return True

    async def settle(self, timeout_s: float = 60.0) -> None:
        """Wait until every valid request is decided or rejected and every decided one has a
        completion (bounded, and given up after 15 s without progress), then a little longer so
        anything decided or executed twice would show up."""
        assert self.publisher is not None and self.collector is not None
        await self.publisher.flush()
        publisher, collector = self.publisher, self.collector

        def answered() -> int:
            keys = set(publisher.valid)
            rejected = {k for k, action in collector.admissions if action == "reject" and k in keys}
            return len({d.key for d in collector.decisions if d.key in keys} | rejected)

        def completed() -> int:
            return collector.completed(set(publisher.valid))

        await self.until(lambda: answered() >= len(publisher.valid), timeout_s, 15.0, answered)
        await self.until(
            lambda: completed() >= collector.decided(set(publisher.valid)), timeout_s, 15.0, completed
        )
        await asyncio.sleep(3.0)

    # --- figures

    def figures(self) -> dict[str, Any]:
        out: dict[str, Any] = dict.fromkeys(FIGURES)
        publisher, collector = self.publisher, self.collector
        if publisher is None or collector is None:
            return out
        valid = set(publisher.valid)
        # Distinct event ids per key: a record read twice (or a producer's retried batch) is the
        # same event, not a second decision or execution.
        decided = tally(key for key, _ in {(d.key, d.event_id) for d in collector.decisions})
        executed = tally(key for key, _ in {(k, e) for k, e, _ in collector.completions})
        rejected = {k for k, action in collector.admissions if action == "reject"}
        first: dict[Key, float] = {}
        for d in collector.decisions:
            if d.key in valid and (d.key not in first or d.at < first[d.key]):
                first[d.key] = d.at
        once, twice = once_and_twice(valid, decided)
        out.update(
            published=len(valid),
            decided_once=once,
            decided_twice=twice,
            executed_twice=once_and_twice(valid, executed)[1],
            lost=count_lost(valid, decided, rejected),
            dead_lettered=len(collector.dead_letters),
            completions_expected=len({event_id for _, event_id, _ in collector.completions}),
        )
        if rejected & valid:
            out["rejected"] = len(rejected & valid)
        if publisher.bad:
            digests = [digest for digest, _, _ in collector.dead_letters]
            out["bad_published"] = len(publisher.bad)
            out["bad_not_dead_lettered"] = missing_digests(publisher.bad, digests)
        out["valid_dead_lettered"] = sum(
            1 for d, _, _ in collector.dead_letters if d in publisher.valid_digests
        )
        if publisher.failed:
            out["send_failed"] = publisher.failed
        if self.window is not None:
            out["routing_p99_s"] = _round(p99(window_latencies(publisher.valid, first, *self.window)))
        if self.fault_end is not None:
            out["recovered_s"] = _round(recovered_after(self.fault_end, first.values()))
        if self.fault_start is not None:
            out["outage_s"] = _round(recovered_after(self.fault_start, first.values()))
        not_executed = {k for k in valid if k in decided and k not in executed}
        out["decided_not_executed"] = len(not_executed)
        if self.broker_stopped_at is not None:
            stopped = self.broker_stopped_at
            out["decided_not_executed_before_restart"] = sum(1 for k in not_executed if first[k] < stopped)
        last_action = dict(collector.admissions)  # key -> its last admission answer
        held = {k for k in valid if k not in decided and last_action.get(k) == "queue"}
        if held:
            out["held_at_end"] = len(held)
        if self.broker_stopped_at is not None and self.served is not None:
            out.update(self.broker_audit(valid, decided, rejected, not_executed))
        if collector.error:
            out["collector_error"] = collector.error
        out.update(self.extra)
        return out

    def broker_audit(
        self, valid: set[Key], decided: Mapping[Key, int], rejected: set[Key], not_executed: set[Key]
    ) -> dict[str, Any]:
        """broker_restart: what the broker itself lost, apart from what the system lost.

        The old broker's log is gone with it (in memory); the new one, right after its start,
        sometimes acknowledges a record and then does not serve it, or serves two records at one
        offset (seen with Tansu 0.6.0: two produce batches written at overlapping offsets, one
        overwriting the other). A request the broker does not serve cannot be routed, a decision
        it does not serve cannot be executed, a completion it does not serve cannot be stored:
        those are counted here, apart. ``lost`` keeps only requests the broker serves at the end.
        """
        assert self.publisher is not None and self.collector is not None and self.served is not None
        assert self.broker_stopped_at is not None
        served, stopped = self.served, self.broker_stopped_at
        lost = {k for k in valid if k not in decided and k not in rejected}
        old = {k for k, at in self.publisher.acked_at.items() if at < stopped}
        first = {d.key: d.at for d in reversed(self.collector.decisions)}
        return {
            "lost": len(lost & served.request_keys),
            "lost_with_broker_log": len(lost & old),
            "lost_unserved_by_new_broker": len(lost - old - served.request_keys),
            "broker_offset_collisions": served.collisions,
            "decided_not_executed_unserved_by_new_broker": sum(
                1 for k in not_executed if first[k] >= stopped and k not in served.decision_keys
            ),
            "decided_not_executed_at_broker_collisions": sum(
                1
                for k in not_executed
                if first[k] >= stopped and k in served.decision_keys and k in served.collided_decision_keys
            ),
        }

    def missing_completions(self, stored: set[str]) -> dict[str, int]:
        """Completions seen on ``tf.completions`` but not in the store; after a broker restart
        also how many of them only the old broker's log held (read by the collector before the
        restart: the worker may not have read them yet) or the new broker no longer serves."""
        assert self.collector is not None
        completions = self.collector.completions
        missing = {e for _, e, _ in completions} - stored
        out = {"completions_missing": len(missing)}
        if self.served is not None:
            old = {e for _, e, _ in completions[: self.collector.completions_before_restart]}
            out["completions_missing_with_broker_log"] = len(missing & old)
            unserved = missing - old - self.served.completion_ids
            out["completions_missing_unserved_by_new_broker"] = len(unserved)
            collided = (missing - old - unserved) & self.served.collided_completion_ids
            out["completions_missing_at_broker_collisions"] = len(collided)
            # The headline counts what the system lost: not what the broker itself lost.
            out["completions_missing"] = len(missing - old - unserved - collided)
            out["completions_missing_with_broker_losses"] = len(missing)
        return out

    def read_store(self) -> set[str] | None:
        """The completion event ids in the embedded store (no worker may run)."""
        if any(w.process.poll() is None for w in self.workers):
            raise RuntimeError("a worker still runs: the embedded store is locked")
        path = (self.data_dir / "clickhouse").resolve()
        if not path.exists():
            return None
        client = connect(f"chdb:///{path}")
        try:
            rows = client.query("SELECT DISTINCT event_id FROM completions").result_rows
        finally:
            client.close()
        return {str(row[0]) for row in rows}


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


# ---------------------------------------------------------------- the scenarios


async def _started(run: Run, warm_up: bool = True) -> WorkerProcess:
    """Broker, clients, a worker with the embedded store, the fleet, and (``warm_up``) routing."""
    await run.start_broker()
    await run.start_clients()
    worker = run.start_worker()
    await worker.wait_ready_async(90)
    await run.start_fleet()
    if warm_up:
        await run.warm_up()
    return worker


async def baseline(run: Run) -> None:
    """No fault: steady valid traffic for 20 s. Its p99 is the reference for the others."""
    await _started(run)
    start = time.time()
    await run.steady("s", 20)
    run.window = (start, time.time())
    await run.settle()


async def fuzz(run: Run) -> None:
    """10 000 fuzzed messages (seeded mutations of valid requests: random bytes, truncated JSON,
    wrong types, huge numbers, NaN and infinities, extra and missing fields, non-objects, bad
    UTF-8; each checked not to decode) shuffled among 500 valid requests, ~1 000 msg/s, mostly
    on the pool's key (one partition), some on random keys or none."""
    await _started(run)
    assert run.publisher is not None and run.collector is not None
    bad = fuzzed_messages(10_000, seed=1)
    items: list[bytes | None] = [*bad, *([None] * 500)]  # None: a valid request goes there
    run.rng.shuffle(items)
    start, sent, valid_index = time.monotonic(), 0, 0
    t0 = time.time()
    while sent < len(items):
        due = min(len(items), int((time.monotonic() - start) * 1000) + 1)
        for item in items[sent:due]:
            if item is None:
                run.publisher.request(run.valid("v", valid_index))
                valid_index += 1
            else:
                roll = run.rng.random()
                key = MODEL.encode() if roll < 0.9 else None if roll < 0.95 else run.rng.randbytes(8)
                run.publisher.send(item, key)
        sent = due
        await asyncio.sleep(0.01)
    await run.publisher.flush()
    run.window = (t0, time.time())
    run.fault_end = time.time()
    await run.steady("after", 3)
    await run.settle()
    collector = run.collector
    await run.until(
        lambda: len(collector.dead_letters) >= len(bad), 60, 15, lambda: len(collector.dead_letters)
    )


async def poison(run: Run) -> None:
    """Each poison pill (``attempt`` 1e6, ``input_tokens`` 1e12, ``deadline_ts`` NaN and 1e20,
    ``ts`` 1e20, a 5 MB request with 270 000 block hashes) three times, each after 10 valid
    requests on the same key (partition); then 5 s of valid traffic: it must keep flowing."""
    await _started(run)
    assert run.publisher is not None and run.collector is not None
    pills = poison_pills(run.rng)
    t0, index = time.time(), 0
    for _ in range(3):
        for raw in pills.values():
            for _ in range(10):
                run.publisher.request(run.valid("v", index))
                index += 1
                await asyncio.sleep(0.025)
            run.publisher.send(raw, MODEL.encode())
    await run.publisher.flush()
    run.fault_end = time.time()
    after = await run.steady("after", 5)
    run.window = (t0, time.time())
    await run.settle()
    collector, publisher = run.collector, run.publisher
    await run.until(lambda: len(collector.dead_letters) >= 3 * len(pills), 30)
    late = {k for k, ts in publisher.valid.items() if ts > (run.fault_end or 0)}
    run.extra["decided_after_last_pill"] = f"{collector.decided(late)}/{len(late)}"
    run.extra["pills"] = list(pills)
    del after


async def worker_kill(run: Run) -> None:
    """Steady traffic for 40 s; at 12 s the worker is killed (SIGKILL) and a new one (same app
    id, same data dir) started at once."""
    first = await _started(run)
    publishing = asyncio.create_task(run.steady("s", 40))
    try:
        await asyncio.sleep(12)
        killed_at = time.time()
        await run.stop_worker(first, kill=True)
        second = run.start_worker()
        await second.wait_ready_async(90)
        run.window = (killed_at, time.time())
        run.fault_start, run.fault_end = killed_at, run.window[1]
    finally:
        await asyncio.wait_for(publishing, timeout=60)
    await run.settle()
    assert run.collector is not None
    run.extra["workers_deciding"] = len({d.worker for d in run.collector.decisions})


def _spool_segments(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "spool").glob("[0-9]" * 12 + "-*.jsonl"))


async def store_down_at_start(run: Run) -> None:
    """A worker whose store is unreachable (``http://127.0.0.1:<free port>``, nothing listens)
    routes 15 s of steady traffic (feedback spools to ``<data_dir>/spool``) and is stopped; a
    worker with the embedded store on the same data dir takes over (traffic goes on) and drains
    the spool. ``spool_drained_s``: its readiness -> no spool segment left."""
    await run.start_broker()
    await run.start_clients()
    down = run.start_worker(dsn=f"http://127.0.0.1:{free_port()}")
    await down.wait_ready_async(90)
    await run.start_fleet()
    await run.warm_up()
    t0 = time.time()
    publishing = asyncio.create_task(run.steady("s", 35))
    try:
        await asyncio.sleep(15)
        down_until = time.time()
        await run.stop_worker(down)
        segments = _spool_segments(run.data_dir)
        run.extra["spool_segments"] = len(segments)
        run.extra["spooled_completions"] = sum(
            len(p.read_bytes().splitlines()) for p in segments if p.name.endswith("-completions.jsonl")
        )
        embedded = run.start_worker()
        await embedded.wait_ready_async(90)
        ready_at = time.time()
        run.window, run.fault_end = (t0, ready_at), ready_at
    finally:
        await asyncio.wait_for(publishing, timeout=60)
    await run.settle()
    assert run.publisher is not None and run.collector is not None
    first = {d.key: d.at for d in reversed(run.collector.decisions)}
    run.extra["routing_p99_store_down_s"] = _round(
        p99(window_latencies(run.publisher.valid, first, t0, down_until))
    )
    drained = await run.until(lambda: not _spool_segments(run.data_dir), 90)
    run.extra["spool_drained_s"] = round(time.time() - ready_at, 3) if drained else None
    await asyncio.sleep(2.0)  # the last batch written before its segment went is committed


INJECT_DIR = Path(__file__).resolve().parent / "inject"
STORE_OUTAGE_S = 60.0


async def store_down_mid_run(run: Run) -> None:
    """A worker with the embedded store routes 100 s of steady traffic; from 15 s on, for 60 s,
    every call it makes to ClickHouse fails (``bench/inject/sitecustomize.py``: the error a
    client gets from a server that went away, injected at the client edge inside the worker,
    since the embedded engine cannot be stopped apart from it). ``spool_drained_s``: the store's
    return -> no spool segment left.

    The reference the outage's latency is judged against is a *control run*: the same traffic
    on a fresh broker and worker with no outage, its p99 over the same seconds of its run
    (``routing_p99_control_s``; ``routing_p99_ratio`` = outage / control). Not the seconds
    before the outage: the embedded broker's CPU grows with its in-memory log (measured 8 % of
    a core 10 s into this scenario, 79 % at 100 s), so every later window is slower than an
    earlier one, outage or not. ``routing_p99_before_s`` / ``_after_s``: the outage run's 15 s
    before and 25 s after the outage, for reference."""
    control = Run(f"{run.name}-control", run.data_dir / "control")  # first, alone on the machine
    control.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        reference = await _steady_with_store_outage(control, outage=False)
    finally:
        await control.close()
    timeline = await _steady_with_store_outage(run, outage=True)
    down, up = timeline["outage"]
    c_down, c_up = reference["outage"]
    assert control.publisher is not None and run.publisher is not None
    c_p99 = p99(window_latencies(control.publisher.valid, reference["first"], c_down, c_up))
    run.extra["routing_p99_control_s"] = _round(c_p99)
    outage_p99 = p99(window_latencies(run.publisher.valid, timeline["first"], down, up))
    run.extra["routing_p99_ratio"] = None if not (c_p99 and outage_p99) else round(outage_p99 / c_p99, 2)


async def _steady_with_store_outage(run: Run, outage: bool) -> dict[str, Any]:
    """The traffic of ``store_down_mid_run`` on ``run``, with the store failing from 15 s to 75 s
    if ``outage``; returns the outage's (start, end) wall times and each key's first decision time."""
    flag = run.data_dir / "store-down"
    repo = INJECT_DIR.parents[1]
    await run.start_broker()
    await run.start_clients()
    worker = run.start_worker(
        PYTHONPATH=os.pathsep.join([str(INJECT_DIR), str(repo), os.environ.get("PYTHONPATH", "")]),
        TOKENFLEET_FAULT_STORE_DOWN_FILE=str(flag),
    )
    await worker.wait_ready_async(90)
    await run.start_fleet()
    await run.warm_up()
    t0 = time.time()
    publishing = asyncio.create_task(run.steady("s", STORE_OUTAGE_S + 40))
    try:
        await asyncio.sleep(15)
        if outage:
            flag.touch()
            _log(f"{run.name}: store down")
        down_at = time.time()
        await asyncio.sleep(STORE_OUTAGE_S)
        if outage:
            run.extra["spool_segments"] = len(_spool_segments(run.data_dir))
            flag.unlink()
            _log(f"{run.name}: store back")
        up_at = time.time()
        if outage:
            run.window, run.fault_start, run.fault_end = (down_at, up_at), down_at, up_at
    finally:
        await asyncio.wait_for(publishing, timeout=60)
    end = time.time()
    await run.settle()
    assert run.publisher is not None and run.collector is not None
    first = {d.key: d.at for d in reversed(run.collector.decisions)}
    if outage:
        for name, (lo, hi) in {"before": (t0, down_at), "after": (up_at, end)}.items():
            latencies = window_latencies(run.publisher.valid, first, lo, hi)
            run.extra[f"routing_p99_{name}_s"] = _round(p99(latencies))
        drained = await run.until(lambda: not _spool_segments(run.data_dir), 90)
        run.extra["spool_drained_s"] = round(time.time() - up_at, 3) if drained else None
        await asyncio.sleep(2.0)  # the last batch written before its segment went is committed
    return {"outage": (down_at, up_at), "first": first}


async def held_restart(run: Run) -> None:
    """50 requests (class batch, deadline in 10 min: they do not time out while held) before
    any heartbeat, a graceful restart of the worker, then the fleet starts (heartbeats)."""
    await run.start_broker()
    await run.start_clients()
    assert run.publisher is not None and run.collector is not None
    first = run.start_worker()
    await first.wait_ready_async(90)
    t0 = time.time()
    held = [run.valid("h", i, slo_class="batch", deadline_ts=time.time() + 600) for i in range(50)]
    for request in held:
        run.publisher.request(request)
    await run.publisher.flush()
    keys = {(r.request_id, r.attempt) for r in held}
    collector = run.collector
    await run.until(lambda: collector.answered_admissions(keys) >= len(keys), 30)
    run.extra["held_answered_before_restart"] = collector.answered_admissions(keys)
    run.extra["decided_before_heartbeats"] = collector.decided(keys)
    await asyncio.sleep(1.5)  # the lane commits (below the held requests)
    await run.stop_worker(first)
    second = run.start_worker()
    await second.wait_ready_async(90)
    await run.start_fleet()
    run.window = (t0, time.time())
    run.fault_end = run.window[1]
    await run.settle()


async def broker_restart(run: Run) -> None:
    """Steady traffic for 45 s; at 12 s the broker is stopped (its in-memory log goes with it)
    and 1 s later a new embedded broker is started on the same port; the suite creates the
    topics again (the old broker's metadata is gone too). The worker, fleet and collector are
    left to reconnect on their own. ``lost_with_broker_log``: lost requests the old broker had
    acknowledged; ``lost_after_restart``: lost requests the new broker acknowledged."""
    await _started(run)
    port = int(run.bootstrap.rsplit(":", 1)[1])
    publishing = asyncio.create_task(run.steady("s", 45))
    try:
        await asyncio.sleep(12)
        run.broker_stopped_at = time.time()
        await asyncio.to_thread(run.stop_broker)
        _log(f"{run.name}: broker stopped")
        await asyncio.sleep(1.0)
        for attempt in range(10):
            try:
                await run.start_broker(port)
                break
            except Exception as exc:
                _log(f"{run.name}: broker restart attempt {attempt + 1} failed: {exc}")
                await asyncio.sleep(1.0)
        else:
            raise RuntimeError(f"no broker could be started again on port {port}")
        _log(f"{run.name}: broker back on port {port}")
        assert run.collector is not None
        await run.collector.restart()
        run.fault_start = run.broker_stopped_at
        run.window = (run.broker_stopped_at, time.time())
        run.fault_end = run.window[1]
    finally:
        await asyncio.wait_for(publishing, timeout=90)
    await run.settle(timeout_s=60)
    worker = run.workers[-1]
    run.extra["worker_alive"] = worker.process.poll() is None
    run.served = await BrokerLog.read(run.bootstrap)


SCENARIOS: dict[str, Callable[[Run], Awaitable[None]] | None] = {
    "baseline": baseline,
    "fuzz": fuzz,
    "poison": poison,
    "worker_kill": worker_kill,
    "store_down_at_start": store_down_at_start,
    "store_down_mid_run": store_down_mid_run,
    "held_restart": held_restart,
    "broker_restart": broker_restart,
}
NOTES: dict[str, str] = {}  # scenario -> why it is not run


async def run_scenario(name: str, root: Path) -> dict[str, Any]:
    """One scenario on a fresh broker and data dir: its figures, with ``error`` if it failed."""
    scenario = SCENARIOS[name]
    if scenario is None:
        return {**dict.fromkeys(FIGURES), "note": NOTES[name]}
    run = Run(name, root / name)
    run.data_dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    error = ""
    _log(f"{name}: starting (data {run.data_dir})")
    try:
        await asyncio.wait_for(scenario(run), timeout=SCENARIO_LIMIT_S)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:2000]
        _log(f"{name}: failed: {error}")
        for worker in run.workers[-1:]:
            _log(f"{name}: last worker's log tail:\n{worker.log()[-1500:]}")
    finally:
        await run.close()
    figures = run.figures()
    try:
        stored = run.read_store()
        figures["completions_stored"] = None if stored is None else len(stored)
        if stored is not None:
            figures.update(run.missing_completions(stored))
    except Exception as exc:
        figures["store_error"] = f"{type(exc).__name__}: {exc}"[:500]
    if error:
        figures["error"] = error
    figures["seconds"] = round(time.monotonic() - began, 1)
    _log(f"{name}: done in {figures['seconds']:.0f} s: {json.dumps(figures)}")
    return figures


HEADERS = ("published", "once", "twice", "exec x2", "lost", "DLQ", "stored", "expected", "p99 s", "recov s")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def format_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    width = max([len("scenario"), *map(len, results)])
    lines = [
        "| " + " | ".join(["scenario".ljust(width), *HEADERS, "notes"]) + " |",
        "|" + "|".join(["-" * (width + 2), *("-" * (len(h) + 2) for h in HEADERS), "-------"]) + "|",
    ]
    for name, figures in results.items():
        cells = [
            _cell(figures.get(key)).rjust(len(header)) for key, header in zip(FIGURES, HEADERS, strict=True)
        ]
        notes = {
            k: v for k, v in figures.items() if k not in FIGURES and k not in ("note", "error", "seconds")
        }
        text = ", ".join(f"{k}={_cell(v)}" for k, v in notes.items())
        if "error" in figures:
            text = f"ERROR {figures['error'].splitlines()[0][:160]}; " + text
        if "note" in figures:
            text = "not run (see note)"
        lines.append("| " + " | ".join([name.ljust(width), *cells, text]) + " |")
    return "\n".join(lines)


async def run_all(names: Sequence[str], root: Path) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        results[name] = await run_scenario(name, root)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), metavar="NAME", help="run only these")
    parser.add_argument("--json", type=Path, help="write {'scenarios': {NAME: figures}} here")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs (worker and broker logs)")
    args = parser.parse_args(argv)
    # aiokafka logs every failed connection during the broker restart: the figures say what
    # happened, and the workers' own logs are in their data dirs (--keep).
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    names = [n for n in SCENARIOS if not args.only or n in args.only]
    root = Path(tempfile.mkdtemp(prefix="tokenfleet-faults-"))
    try:
        results = asyncio.run(run_all(names, root))
    finally:
        if args.keep:
            _log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(format_table(results))
    for name, figures in results.items():
        if "note" in figures:
            print(f"\n{name}: {figures['note']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"scenarios": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
