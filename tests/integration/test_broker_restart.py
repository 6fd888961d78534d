"""A broker outage survived: the worker (supervisor + watchdog) and the fleet dispatcher come back.

The embedded broker (Tansu) keeps its log in memory: the broker started again on the same port
has no topics, no committed offsets and no consumer groups. The worker's watchdog sees that (a
high watermark went down, or its topics are gone) and exits; its supervisor recreates the topics
and starts a fresh worker. The fleet's dispatcher keeps its engines and its clients (which
reconnect on their own): once a partition's high watermark went down, every partition is read
again from its start; only a dispatcher whose fetches or deliveries stop altogether starts new clients (and
recreates the topics). This test owns its broker (not the session's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from dispatcher.service import run_fleet
from infra.kafka.broker import embedded_broker, ensure_topics, free_port
from infra.kafka.connection import KafkaConnection
from lab.worker_process import WorkerProcess
from schemas.events import Completion, InferenceRequest, RoutingDecision
from schemas.topics import COMPLETIONS, DECISIONS, HEARTBEATS, REQUESTS
from tests.integration.streaming import Collector, heartbeat, publish, unique
from tests.integration.streaming import worker as worker_process

POOL = "llama3-8b"  # the emulated fleet's model: this broker is ours alone
# Routing again after the broker's return: the child exits at once when the broker goes away and a
# fresh one starts and joins once it answers. Measured 9.30-10.79 s on 2 cores (2026-12-03, on this
# and the previous commit alike), so 10 s failed one run in two; 15 s is the bound issue 26 sets
# for a dead worker's partitions to be routed again. A worker that stalls (37 s before) still fails.
RECOVERY_BUDGET_S = 15.0
FLEET_RECOVERY_BUDGET_S = 15.0  # the fleet executes again (measured: 5.65 and 6.21 s)


def a_request(request_id: str) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        model=POOL,
        input_tokens=200,
        output_budget=8,
        prompt_block_hashes=(1, 2),
    )


def ids_in(raw: list[bytes], kind: type[RoutingDecision] | type[Completion]) -> set[str]:
    return {kind.model_validate_json(v).request_id for v in raw}


async def wait_until(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        await asyncio.sleep(0.1)


def health(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class Broker:
    """An embedded broker on a fixed port that can be stopped and started again."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.port, self.log_path = port, log_path
        self._running: contextlib.ExitStack | None = None

    def start(self) -> str:
        stack = contextlib.ExitStack()
        bootstrap = stack.enter_context(embedded_broker(log_path=self.log_path, port=self.port))
        self._running = stack
        return bootstrap

    def stop(self) -> None:
        if self._running is not None:
            self._running.close()
            self._running = None


def test_worker_and_fleet_recover_after_the_broker_restarts(tmp_path: Path) -> None:
    broker = Broker(free_port(), tmp_path / "tansu.log")
    bootstrap = broker.start()
    worker = None
    try:
        ensure_topics(KafkaConnection.plaintext(bootstrap), partitions=4)
        worker = worker_process(bootstrap, unique("app"), tmp_path / "worker")
        worker.wait_ready(timeout_s=90)
        first_child = worker.pid
        deadline = time.monotonic() + 15
        while (answer := health(worker.probe_url("/ready")))[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert answer[0] == 200 and answer[1]["consuming"] is True, answer
        timings = asyncio.run(_scenario(bootstrap, broker, worker))
        code = worker.stop()
    finally:
        if worker is not None:
            worker.stop()
            print(f"worker log tail:\n{worker.log()[-3000:]}")
        broker.stop()
    print(
        f"broker down {timings['down_s']:.2f} s; worker routed again {timings['routed_s']:.2f} s and "
        f"the fleet completed {timings['completed_s']:.2f} s after the broker's return; worker child "
        f"{first_child} -> {timings['child']:.0f}; fleet {timings['fleet']}"
    )
    assert code == 0
    assert timings["routed_s"] <= RECOVERY_BUDGET_S
    assert timings["completed_s"] <= FLEET_RECOVERY_BUDGET_S  # NaN (never completed) fails too
    assert timings["child"] != first_child  # the supervisor started a fresh worker child


async def _scenario(bootstrap: str, broker: Broker, worker: WorkerProcess) -> dict[str, Any]:
    stop, ready = asyncio.Event(), asyncio.Event()
    fleet = asyncio.create_task(
        run_fleet(
            KafkaConnection.plaintext(bootstrap),
            "2xllama3-8b-h100",
            10,
            0.2,
            stop,
            unique("fleet"),
            ready=ready,
            partitions=4,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 30)
        before = [f"before-{i}" for i in range(5)]
        async with (
            Collector(bootstrap, DECISIONS, POOL.encode()) as routed,
            Collector(bootstrap, COMPLETIONS, POOL.encode()) as completed,
        ):
            await asyncio.sleep(1.0)  # the fleet's heartbeats reached the worker
            await publish(bootstrap, REQUESTS, [a_request(r) for r in before])
            await wait_until(lambda: set(before) <= ids_in(routed.values, RoutingDecision), 30, "routed")
            await wait_until(lambda: set(before) <= ids_in(completed.values, Completion), 30, "completed")
        assert not fleet.done()

        # The broker goes away; a new one takes its port, empty: no topics, offsets or groups.
        went = time.monotonic()
        broker.stop()
        await asyncio.sleep(0.5)
        assert broker.start() == bootstrap
        back = time.monotonic()

        after: list[str] = []
        routed_at = completed_at = None
        async with (
            Collector(bootstrap, DECISIONS, POOL.encode()) as routed,
            Collector(bootstrap, COMPLETIONS, POOL.encode()) as completed,
        ):
            # Both are judged: the worker routing again (RECOVERY_BUDGET_S) and the dispatcher
            # executing again (FLEET_RECOVERY_BUDGET_S; it took ~15 s, once > 60 s, when it
            # reconnected its clients after every restart).
            deadline = back + 60
            while (routed_at is None or completed_at is None) and time.monotonic() < deadline:
                if routed_at is None and len(after) < 60:  # a new request every 0.5 s until routed
                    after.append(f"after-{len(after)}")
                    # With the request, heartbeats of the fleet's instances: the worker's recovery
                    # is measured on its own, not behind the fleet's reconnection (judged apart).
                    beats = [heartbeat(POOL, instance) for instance in ("i000", "i001")]
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(publish(bootstrap, HEARTBEATS, beats), 5)
                        await asyncio.wait_for(publish(bootstrap, REQUESTS, [a_request(after[-1])]), 5)
                if routed_at is None and ids_in(routed.values, RoutingDecision) & set(after):
                    routed_at = time.monotonic()
                if ids_in(completed.values, Completion) & set(after):
                    completed_at = time.monotonic()
                await asyncio.sleep(0.5)
            assert routed_at is not None, f"nothing routed within 60 s of the broker's return\n{worker.log()}"
            await wait_until(lambda: worker.child_pid() is not None, 30, "the worker ready again")
        assert not fleet.done(), "the fleet dispatcher ended during the outage"
        stop.set()
        counts: Any = None
        if not fleet.done():
            counts = await asyncio.wait_for(fleet, 30)
        return {
            "down_s": back - went,
            "routed_s": routed_at - back,
            "completed_s": math.nan if completed_at is None else completed_at - back,
            "child": worker.pid,
            "fleet": counts,
        }
    finally:
        stop.set()
        if not fleet.done():
            fleet.cancel()
            with contextlib.suppress(BaseException):
                await fleet


def test_the_gateways_reader_of_the_deciders_follows_a_log_that_starts_again(tmp_path: Path) -> None:
    """A restarted broker's log starts again at offset 0: the gateway's reader of
    ``tf.deciders``, positioned past 40 announcements of the old log, hears the first
    announcement of the new one within a poll or two (it did not before: it waited, blind, until
    the new log reached its old offset), and is ready again once it has."""
    broker = Broker(free_port(), tmp_path / "tansu.log")
    bootstrap = broker.start()
    connection = KafkaConnection.plaintext(bootstrap)
    try:
        ensure_topics(connection, partitions=1)
        asyncio.run(_announce(connection, "before", 40))
        heard = asyncio.run(_restart_under_the_reader(connection, broker))
    finally:
        broker.stop()
    print(f"the new log's first announcement heard {heard:.2f} s after it was published")
    assert heard <= 3.0


async def _announce(connection: KafkaConnection, worker: str, count: int) -> None:
    from aiokafka import AIOKafkaProducer

    from infra.kafka.clients import send_event, start_client
    from schemas.events import DeciderAnnouncement
    from schemas.topics import DECIDERS

    producer = await start_client(lambda: AIOKafkaProducer(**connection.client_options()), "test")
    try:
        for i in range(count):
            said = DeciderAnnouncement(worker=worker, scheduler="s", address=f"127.0.0.1:{1000 + i}")
            await (await send_event(producer, DECIDERS, said))
    finally:
        await producer.stop()


async def _restart_under_the_reader(connection: KafkaConnection, broker: Broker) -> float:
    from gateway.deciders import Deciders

    deciders = Deciders(connection, "s")
    await deciders.start()
    try:
        await wait_until(lambda: "before" in deciders._known, 10, "the old log's announcements heard")
        await asyncio.to_thread(broker.stop)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(broker.start)
        await asyncio.to_thread(ensure_topics, connection, 1)
        await _announce(connection, "after", 1)
        published = time.monotonic()
        await wait_until(lambda: "after" in deciders._known, 20, "the new log's announcement heard")
        heard = time.monotonic() - published
        await wait_until(lambda: deciders.ready, 5, "ready again")
        return heard
    finally:
        await deciders.close()
