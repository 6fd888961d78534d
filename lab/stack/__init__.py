"""A whole TokenFleet on one machine, in parts: the one way the lab starts the control plane.

The demos, the benchmarks, the fault scenarios and the integration tests put their runs together
from these parts (and stop them with them), so starting a stack is written once:

- ``broker`` (synchronous, a ``with`` block) and ``EmbeddedBroker`` (in an event loop; can be
  stopped and started again on its port): the embedded Kafka broker (Tansu, memory storage)
  with the project's topics, or a broker given by its bootstrap;
- ``WorkerOptions`` / ``start_worker``: ``tokenfleet worker`` processes (``lab.worker_process``);
- ``Dispatcher``: the dispatcher (``dispatcher.service.run_fleet``, an emulated fleet or real
  engines) as a task of this event loop; ``ServiceProcess``: a ``tokenfleet`` command (the
  dispatcher, the gateway) as its own process, as deployed; ``StaticFleet``: instances that only
  report (heartbeats), to measure the worker alone;
- ``Publisher`` and ``publish``: requests (any records) onto the broker;
- ``Collector``: a background reader of the output topics; ``ValueCollector`` keeps one topic's
  values by key;
- ``Stack``: the parts of one run, stopped in order by ``close``.

Every wait here is bounded. Product code never imports the lab (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from dispatcher.engines.port import EnginePort
from dispatcher.service import FleetCounts
from infra.kafka.broker import ensure_topics_async
from infra.kafka.connection import KafkaConnection
from lab.stack.clients import Collector, Publisher, ValueCollector, publish
from lab.stack.kafka import PARTITIONS, EmbeddedBroker, broker
from lab.stack.processes import (
    Dispatcher,
    ServiceProcess,
    StaticFleet,
    WorkerOptions,
    heartbeat,
    start_worker,
)
from lab.worker_process import WorkerProcess

__all__ = [
    "PARTITIONS",
    "Collector",
    "Dispatcher",
    "EmbeddedBroker",
    "Publisher",
    "ServiceProcess",
    "Stack",
    "StaticFleet",
    "ValueCollector",
    "WorkerOptions",
    "broker",
    "heartbeat",
    "publish",
    "start_worker",
]


class _Client(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...


def _quiet(text: str) -> None:
    return None


class Stack:
    """The parts of one run on this machine: each started when the run needs it, all stopped by
    ``close`` in an order that cuts nothing off — the publishers (what was sent is delivered),
    the dispatcher and the service processes (their last events out), the workers (gracefully:
    their last commits), the collectors (they have seen everything), the broker.

    ``bootstrap``: a broker to use (topics created where missing by ``start_broker``; never
    stopped); without it ``start_broker`` starts an embedded one, which ``stop_broker`` and
    ``start_broker(port)`` stop and start again (an outage). ``worker``: the options every
    ``start_worker`` starts from; its processes' data go to ``data_dir``. ``log``: one line per
    lifecycle event. ``close`` never raises (a step that fails is logged and the rest still
    run); an async context manager closes on exit.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        bootstrap: str | None = None,
        partitions: int = PARTITIONS,
        worker: WorkerOptions | None = None,
        log: Callable[[str], None] = _quiet,
        step_timeout_s: float = 60.0,
    ) -> None:
        self.data_dir, self.partitions, self.log = data_dir, partitions, log
        self.worker_options = worker or WorkerOptions()
        self.step_timeout_s = step_timeout_s
        self.bootstrap = bootstrap or ""
        self.given_broker = bool(bootstrap)
        self.broker = EmbeddedBroker(data_dir / "tansu.log", partitions)
        self.workers: list[WorkerProcess] = []
        self.services: list[ServiceProcess] = []
        self.dispatcher: Dispatcher | None = None
        self.publishers: list[_Client] = []
        self.collectors: list[_Client] = []

    async def start_broker(self, port: int | None = None) -> str:
        """The embedded broker started (on ``port`` if given) with the topics; with a given
        bootstrap, its missing topics created. Returns the bootstrap."""
        if self.given_broker:
            await ensure_topics_async(KafkaConnection.plaintext(self.bootstrap), self.partitions)
            return self.bootstrap
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.bootstrap = await self.broker.start(port)
        return self.bootstrap

    def stop_broker(self) -> None:
        """Stop the embedded broker (a given one is left alone)."""
        self.broker.stop()

    def start_worker(
        self, log_path: Path | None = None, data_dir: Path | None = None, **changes: Any
    ) -> WorkerProcess:
        """A worker with the stack's options, ``changes`` (``WorkerOptions`` fields) applied; its
        output to ``log_path`` (default ``worker-N.log`` in the data dir, N counting from 1)."""
        options = dataclasses.replace(self.worker_options, **changes)
        data_dir = data_dir or self.data_dir
        log_path = log_path or self.data_dir / f"worker-{len(self.workers) + 1}.log"
        worker = start_worker(self.bootstrap, data_dir, options, log_path)
        self.workers.append(worker)
        return worker

    async def stop_worker(self, worker: WorkerProcess, kill: bool = False) -> int:
        """Stop (SIGTERM) or kill (SIGKILL) one worker; its exit code."""
        code = await asyncio.to_thread(worker.stop, kill)
        self.log(f"worker {worker.pid} {'killed' if kill else 'stopped'} (exit {code})")
        return code

    def start_service(self, args: Sequence[str], env: Mapping[str, str], log_name: str) -> ServiceProcess:
        """A ``tokenfleet`` command as its own process (``ServiceProcess``), logging to
        ``log_name`` in the data dir."""
        service = ServiceProcess(
            args, {"TOKENFLEET_KAFKA_BOOTSTRAP": self.bootstrap, **env}, self.data_dir / log_name
        )
        self.services.append(service)
        return service

    async def start_dispatcher(
        self, fleet: str | EnginePort, timeout_s: float = 60.0, **options: Any
    ) -> Dispatcher:
        """The dispatcher in this loop (``Dispatcher``; ``options`` its keyword arguments),
        returned once ready."""
        self.dispatcher = Dispatcher(self.bootstrap, fleet, **options)
        await self.dispatcher.start(timeout_s)
        return self.dispatcher

    async def stop_dispatcher(self) -> FleetCounts | None:
        return None if self.dispatcher is None else await self.dispatcher.stop()

    async def add_publisher(self, publisher: _Client) -> None:
        """Start ``publisher`` (anything with ``start``/``stop``); ``close`` stops it first."""
        await publisher.start()
        self.publishers.append(publisher)

    async def add_collector(self, collector: _Client) -> None:
        """Start ``collector`` (anything with ``start``/``stop``); ``close`` stops it after the
        workers, so it sees what they did last."""
        await collector.start()
        self.collectors.append(collector)

    async def close(self) -> None:
        """Stop everything this stack started, in order; never raises."""
        steps: list[Callable[[], Any]] = [p.stop for p in self.publishers]
        steps.append(self.stop_dispatcher)
        steps += [functools.partial(asyncio.to_thread, s.stop) for s in self.services]
        steps += [functools.partial(self.stop_worker, w) for w in self.workers if w.process.poll() is None]
        steps += [c.stop for c in self.collectors]
        for step in steps:
            try:
                await asyncio.wait_for(step(), timeout=self.step_timeout_s)
            except Exception as exc:
                self.log(f"cleanup step failed: {type(exc).__name__}: {exc}")
        for worker in self.workers:  # closes their log files even when they had exited
            with contextlib.suppress(Exception):
                await asyncio.to_thread(worker.stop)
        self.publishers, self.collectors, self.services = [], [], []
        with contextlib.suppress(Exception):
            self.stop_broker()

    async def __aenter__(self) -> Stack:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
