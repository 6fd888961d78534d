"""The processes and tasks of a lab stack: workers, the dispatcher, services as deployed, and
instances that only report."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from aiokafka import AIOKafkaProducer

from dispatcher.engines.port import EnginePort
from dispatcher.service import FleetCounts, run_fleet
from infra.kafka.clients import start_client
from infra.kafka.connection import KafkaConnection
from lab.worker_process import WorkerProcess
from schemas.codec import encode
from schemas.events import Heartbeat
from schemas.topics import HEARTBEATS, key_of


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How a worker process is configured. Each field is a ``TOKENFLEET_*`` setting; ``None``
    leaves it to this process's environment and the settings' default."""

    policy: str | None = None
    app_id: str | None = None
    """The consumer group and the tables: workers of one app id share (and take over) the work."""
    clickhouse: str | None = None
    """``TOKENFLEET_CLICKHOUSE_DSN``: ``off``, ``""`` (the embedded store in the data dir) or a URL."""
    web_port: int | None = 0
    """Faust web and ``/metrics``; 0: any free port (the worker logs it)."""
    partitions: int | None = None
    run_id: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """More environment (any name), applied last."""
    loglevel: str = "warn"

    def settings(self) -> dict[str, str]:
        """The environment these options give the worker (on top of this process's)."""
        named = {
            "TOKENFLEET_POLICY": self.policy,
            "TOKENFLEET_APP_ID": self.app_id,
            "TOKENFLEET_CLICKHOUSE_DSN": self.clickhouse,
            "TOKENFLEET_WORKER_WEB_PORT": None if self.web_port is None else str(self.web_port),
            "TOKENFLEET_TOPIC_PARTITIONS": None if self.partitions is None else str(self.partitions),
            "TOKENFLEET_RUN_ID": self.run_id,
        }
        return {**{name: value for name, value in named.items() if value is not None}, **self.env}


def start_worker(
    bootstrap: str, data_dir: Path, options: WorkerOptions | None = None, log_path: Path | None = None
) -> WorkerProcess:
    """A ``tokenfleet worker`` process on ``bootstrap``, its data (embedded store, readiness
    marker, spool) in ``data_dir``. Not waited for: ``wait_ready`` / ``wait_ready_async``."""
    options = options or WorkerOptions()
    return WorkerProcess(
        bootstrap, data_dir, options.settings(), log_path=log_path, loglevel=options.loglevel
    )


class ServiceProcess:
    """A ``tokenfleet`` command (``python -m cli.main ARGS``) as its own process, as deployed:
    ``env`` on top of this process's environment, its output to ``log_path``. No readiness of
    its own (the caller knows what ready means: a gateway that answers, a fleet that reports)."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str], log_path: Path) -> None:
        self.args = list(args)
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *self.args],
            env={**os.environ, **env},
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGINT (it shuts down as on Ctrl-C), SIGKILL after ``timeout_s``; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(10)
        self._log.close()
        return code


# ---------------------------------------------------------------- the dispatcher


class Dispatcher:
    """The dispatcher (``dispatcher.service.run_fleet``) over ``fleet`` — an emulated fleet spec
    such as ``2xllama3-8b-h100``, or an engine port (real engines) — as a task of this loop.

    ``start`` returns once its consumer has its partitions (load sent earlier would count the
    group join in its TTFT); it raises the dispatcher's own error if it ended first, and
    ``RuntimeError`` if it is not ready in ``timeout_s`` (it is left to ``stop``). ``stop`` lets
    it finish (what it produced until then is delivered), cancels it after ``timeout_s`` and
    returns its counts (``None`` if it failed or was cancelled). ``on_error`` hears of a failure
    when it happens (the fault suite records when the dispatcher died); ``check`` raises it.
    As an async context manager: started on entry, stopped on exit, its failure raised then.
    """

    def __init__(
        self,
        bootstrap: str,
        fleet: str | EnginePort,
        *,
        group_id: str = "tokenfleet-fleet",
        speed: float = 1.0,
        heartbeat_s: float = 0.25,
        partitions: int | None = None,
        output_tokens: Mapping[str, int] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.bootstrap, self.fleet, self.group_id = bootstrap, fleet, group_id
        self.speed, self.heartbeat_s, self.partitions = speed, heartbeat_s, partitions
        self.output_tokens, self.on_error = output_tokens, on_error
        self.task: asyncio.Task[FleetCounts] | None = None
        self.counts: FleetCounts | None = None
        self.failure: BaseException | None = None
        self._stop = asyncio.Event()

    async def start(self, timeout_s: float = 60.0) -> None:
        ready = asyncio.Event()
        self.task = asyncio.create_task(
            run_fleet(
                KafkaConnection.plaintext(self.bootstrap),
                self.fleet,
                speed=self.speed,
                heartbeat_s=self.heartbeat_s,
                stop=self._stop,
                group_id=self.group_id,
                ready=ready,
                partitions=self.partitions,
                output_tokens=self.output_tokens,
            )
        )
        self.task.add_done_callback(self._ended)
        waiter = asyncio.create_task(ready.wait())
        try:
            await asyncio.wait({waiter, self.task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if self.task.done():
            self.task.result()  # raises its error
            raise RuntimeError("the dispatcher stopped before it was ready")
        if not ready.is_set():
            raise RuntimeError(f"the dispatcher got no partition within {timeout_s:.0f} s")

    def _ended(self, task: asyncio.Task[FleetCounts]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            self.failure = error
            if self.on_error is not None:
                self.on_error(error)

    def check(self) -> None:
        """Raise the dispatcher's failure, if it failed."""
        if self.failure is not None:
            raise self.failure

    async def stop(self, timeout_s: float = 15.0) -> FleetCounts | None:
        task, self.task = self.task, None
        if task is None:
            return self.counts
        self._stop.set()
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=10)
        if task.done() and not task.cancelled() and task.exception() is None:
            self.counts = task.result()
        return self.counts

    async def __aenter__(self) -> Dispatcher:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()
        if exc is None:
            self.check()


def heartbeat(
    model: str,
    instance_id: str,
    waiting: int = 0,
    dc: str = "dc-1",
    *,
    model_version: str = "1",
    profile: str = "llama3-8b-h100",
    kv_blocks_total: int = 820,
) -> Heartbeat:
    """An idle, ready instance's report (nothing running, no KV in use), stamped now."""
    return Heartbeat(
        instance_id=instance_id,
        dc=dc,
        model=model,
        model_version=model_version,
        profile=profile,
        waiting=waiting,
        running=0,
        tokens_in_flight=0,
        kv_blocks_used=0,
        kv_blocks_total=kv_blocks_total,
    )


class StaticFleet:
    """Instances that only report: ``beats()`` (fresh heartbeats, stamped when called) sent every
    ``interval_s`` until ``stop``; nothing is executed. For measuring the worker alone."""

    def __init__(self, bootstrap: str, beats: Callable[[], Iterable[Heartbeat]], interval_s: float) -> None:
        self.bootstrap, self.beats, self.interval_s = bootstrap, beats, interval_s
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        producer = await start_client(
            lambda: AIOKafkaProducer(bootstrap_servers=self.bootstrap), "heartbeats"
        )
        try:
            while not self._stop.is_set():
                for beat in self.beats():
                    await producer.send(HEARTBEATS.name, encode(beat), key=key_of(HEARTBEATS, beat))
                await producer.flush()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=self.interval_s)
        finally:
            await producer.stop()

    async def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout=timeout_s)
