"""The fault suite's harness: one scenario's run — its stack, its traffic, its waits and its
figures (definitions: ``lab.faults``).

A ``Run`` owns a ``lab.stack.Stack`` (fresh embedded broker and data dir; workers with the
embedded store, app id ``faults-<scenario>-<pid>``, policy ``least-request``; the emulated fleet
``FLEET`` in this process) and the apparatus that measures it (``lab.faults.clients``): the
scenario starts the parts in the order its fault needs, ``close`` stops them all, and
``figures`` counts what the collector and the publisher saw.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from infra.clickhouse.client import connect
from infra.clickhouse.topic_sink import store_group
from lab.faults import FLEET, PARTITIONS, RATE_PER_S, log
from lab.faults.clients import BrokerLog, Collector, Publisher
from lab.faults.messages import valid_request
from lab.faults.tally import (
    FIGURES,
    Key,
    count_lost,
    missing_digests,
    once_and_twice,
    p99,
    recovered_after,
    rounded,
    tally,
    window_latencies,
)
from lab.stack import Stack, WorkerOptions
from lab.worker_process import WorkerProcess
from schemas.events import InferenceRequest
from schemas.topics import COMPLETIONS


@dataclass
class Run:
    """Everything one scenario starts (``stack``), and what it measured; ``close`` stops it all.

    ``inject_dir``: the directory whose ``sitecustomize`` injects a store outage into a worker
    (``store_down_mid_run``); ``None``: that scenario cannot run."""

    name: str
    data_dir: Path
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    collector: Collector | None = None
    publisher: Publisher | None = None
    window: tuple[float, float] | None = None  # the fault window (time.time()), for routing_p99_s
    fault_start: float | None = None  # for outage_s
    fault_end: float | None = None  # for recovered_s
    broker_stopped_at: float | None = None  # for lost_with_broker_log
    served: BrokerLog | None = None  # what the (new) broker serves at the end, for the audit
    extra: dict[str, Any] = field(default_factory=dict)
    inject_dir: Path | None = None
    started_at: float = field(default_factory=time.time)
    stack: Stack = field(init=False)

    def __post_init__(self) -> None:
        self.app_id = f"faults-{self.name}-{os.getpid()}"
        self.stack = Stack(
            self.data_dir,
            partitions=PARTITIONS,
            worker=WorkerOptions(
                app_id=self.app_id,
                clickhouse="",  # the embedded store in the run's data dir
                web_port=0,
                partitions=PARTITIONS,
                policy="least-request",
                loglevel="info",
            ),
            log=lambda text: log(f"{self.name}: {text}"),
        )

    @property
    def bootstrap(self) -> str:
        return self.stack.bootstrap

    @property
    def workers(self) -> list[WorkerProcess]:
        return self.stack.workers

    # --- lifecycle (the stack's, with the suite's apparatus and records)

    async def start_clients(self) -> None:
        """The collector, then the publisher; the stack stops them."""
        self.collector = Collector(self.bootstrap)
        await self.stack.add_collector(self.collector)
        self.publisher = Publisher(self.bootstrap)
        await self.stack.add_publisher(self.publisher)

    async def start_fleet(self, timeout_s: float = 40.0) -> None:
        """The emulated fleet, in this process; if it dies, when and why are figures."""
        await self.stack.start_dispatcher(
            FLEET, timeout_s, group_id=f"fleet-{self.app_id}", on_error=self._fleet_ended
        )

    def _fleet_ended(self, error: BaseException) -> None:
        self.extra["fleet_error"] = f"{type(error).__name__}: {error}"[:300]
        self.extra["fleet_died_at_s"] = round(time.time() - self.started_at, 1)
        log(f"{self.name}: the fleet stopped with {self.extra['fleet_error']}")

    async def close(self) -> None:
        """Stop everything this run started, in order; never raises."""
        await self.stack.close()

    # --- traffic and waits

    def valid(self, prefix: str, i: int, **fields: Any) -> InferenceRequest:
        return valid_request(self.rng, f"{self.name}-{prefix}-{i}", **fields)

    async def steady(
        self, prefix: str, seconds: float, rate: float = RATE_PER_S, start_index: int = 0
    ) -> int:
        """``round(seconds * rate)`` valid requests at ``rate`` over ``seconds`` (sends never block
        the pace; after a stall of this process the ones due are sent at once, the last ones
        included, so every run sends as many); returns the next index."""
        assert self.publisher is not None
        start, i, end = time.monotonic(), start_index, start_index + round(seconds * rate)
        while i < end:
            due = min(end, start_index + int((time.monotonic() - start) * rate) + 1)
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
        anything decided or executed twice would show up, then for the store
        (``store_caught_up``)."""
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
        # The clients' view: every request answered (resends take RESEND_AFTER_S each).
        waiting = publisher.answers
        await self.until(lambda: waiting.waiting == 0, timeout_s, 25.0, lambda: waiting.waiting)
        await asyncio.sleep(3.0)
        await self.store_caught_up(timeout_s)

    async def store_caught_up(self, timeout_s: float, stall_s: float = 20.0) -> int | None:
        """Wait until the store has every completion on ``tf.completions``: the store's consumer
        group (``<app id>-store``) committed each partition to its end, and it commits only
        what the store made durable (``infra.clickhouse.topic_sink``). Bounded, and given up
        after ``stall_s`` without progress. Returns the completions not yet committed then
        (``None``: the broker could not say).

        Why: the workers are stopped right after, and the store is read once they stopped; a
        store consumer still behind (on a busy machine, or rebalancing after a worker joined or
        left) would leave rows on the log, not lost but not stored either: those are the
        system's to store, not the judge's to miss."""
        left: int | None = None
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap, group_id=store_group(self.app_id), enable_auto_commit=False
        )
        try:
            await consumer.start()
            tps = [TopicPartition(COMPLETIONS.name, p) for p in range(PARTITIONS)]

            async def lag() -> int:
                ends = await consumer.end_offsets(tps)
                behind = 0
                for tp in tps:
                    committed = await consumer.committed(tp)
                    behind += max(0, int(ends[tp]) - int(committed or 0))
                return behind

            deadline, last, last_change = time.monotonic() + timeout_s, -1, time.monotonic()
            while (left := await lag()) > 0 and time.monotonic() < deadline:
                if left != last:
                    last, last_change = left, time.monotonic()
                elif time.monotonic() - last_change > stall_s:
                    break
                await asyncio.sleep(0.5)
        except Exception as exc:  # the figures say what was stored, whatever this could see
            log(f"{self.name}: could not read the store's progress: {exc!r}")
        finally:
            await consumer.stop()
        if left:
            log(f"{self.name}: {left} completions not yet committed by the store's consumer")
        return left

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
            never_answered=publisher.never_answered,
        )
        if publisher.answers.resent:
            out["resent"] = publisher.answers.resent
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
            out["routing_p99_s"] = rounded(p99(window_latencies(publisher.valid, first, *self.window)))
        if self.fault_end is not None:
            out["recovered_s"] = rounded(recovered_after(self.fault_end, first.values()))
        if self.fault_start is not None:
            out["outage_s"] = rounded(recovered_after(self.fault_start, first.values()))
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
        out, missing, old = missing_from_store(self.collector, stored, self.served is not None)
        if self.served is not None:
            unserved = missing - old - self.served.completion_ids
            out["completions_missing_unserved_by_new_broker"] = len(unserved)
            collided = (missing - old - unserved) & self.served.collided_completion_ids
            out["completions_missing_at_broker_collisions"] = len(collided)
            # The headline counts what the system lost: not what the broker itself lost.
            out["completions_missing"] = len(missing - old - unserved - collided)
            out["completions_missing_with_broker_losses"] = len(missing)
        return out

    def read_store(self) -> set[str] | None:
        """The completion event ids in the embedded stores (the run's data dir and any other
        data dir a worker had: each worker keeps the partitions it was given; no worker may
        run, the embedded engine locks its directory)."""
        if any(w.process.poll() is None for w in self.workers):
            raise RuntimeError("a worker still runs: the embedded store is locked")
        return stored_completions(
            d / "clickhouse" for d in [self.data_dir, *(w.data_dir for w in self.workers)]
        )


def missing_from_store(
    collector: Collector, stored: set[str], broker_restarted: bool
) -> tuple[dict[str, int], set[str], set[str]]:
    """The completions ``collector`` saw on ``tf.completions`` that are not in ``stored``:
    their count (``completions_missing``) and, after a broker restart, how many of them the old
    broker's log held (``completions_missing_with_broker_log``); with the missing ids and those
    the collector read before the restart (empty without one)."""
    completions = collector.completions
    missing = {e for _, e, _ in completions} - stored
    out = {"completions_missing": len(missing)}
    old: set[str] = set()
    if broker_restarted:
        old = {e for _, e, _ in completions[: collector.completions_before_restart]}
        out["completions_missing_with_broker_log"] = len(missing & old)
    return out, missing, old


def stored_completions(stores: Iterable[Path]) -> set[str] | None:
    """Completion event ids in the embedded stores at ``stores`` (those that exist; ``None``:
    none does). Each is opened alone: the embedded engine locks its directory."""
    found: set[str] | None = None
    for path in sorted({p.resolve() for p in stores if p.exists()}):
        client = connect(f"chdb:///{path}")
        try:
            rows = client.query("SELECT DISTINCT event_id FROM completions").result_rows
        finally:
            client.close()
        found = (found or set()) | {str(row[0]) for row in rows}
    return found


async def started(run: Run, warm_up: bool = True) -> WorkerProcess:
    """Broker, clients, a worker with the embedded store, the fleet, and (``warm_up``) routing."""
    await run.stack.start_broker()
    await run.start_clients()
    worker = run.stack.start_worker()
    await worker.wait_ready_async(90)
    await run.start_fleet()
    if warm_up:
        await run.warm_up()
    return worker


def spool_segments(data_dir: Path) -> list[Path]:
    """The feedback spool's segments a worker left in ``data_dir`` (what the store has not got)."""
    return sorted((data_dir / "spool").glob("[0-9]" * 12 + "-*.jsonl"))
