"""``gateway_broker_restart``: the embedded broker killed (kill -9) after a long run of traffic,
its in-memory log lost; ``up``'s supervisor starts a new, empty one on the same port (and
creates the topics again). Calls go on through the gateway all along."""

from __future__ import annotations

import asyncio
import contextlib

from aiokafka import AIOKafkaConsumer, TopicPartition

from lab.faults import log
from lab.faults.gateway_harness import GatewayRun, GatewayScenario
from schemas.topics import DECIDERS, REQUESTS

KILL_AFTER_S = 90.0  # of traffic: the old logs' offsets are far beyond what a new one reaches soon


async def end_offsets(bootstrap: str, topics: tuple[str, ...]) -> dict[str, int]:
    """The highest end offset of any partition of each topic (what a reader that kept its offsets
    would wait for the new log to reach)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer.topics()  # the cluster's metadata, so the partitions are known
        out = {}
        for topic in topics:
            partitions = consumer.partitions_for_topic(topic) or set()
            ends = await consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
            out[topic] = max(ends.values(), default=0)
        return out
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()


async def _body(run: GatewayRun) -> None:
    """300 calls over 150 s; at ``KILL_AFTER_S`` the broker is killed. ``fault_end``: the new
    broker accepts connections with its topics (the supervisor marks it ready); the collector then
    reads the new log from its start. ``log_end_at_kill_*``: the old logs' highest end offsets of
    ``tf.deciders`` and ``tf.requests``. Targets: answers resume within 15 s of the broker's
    return (``resumed_s``), 0 failed calls."""
    assert run.state is not None and run.collector is not None
    traffic = asyncio.create_task(run.traffic_for(150.0))
    try:
        await asyncio.sleep(KILL_AFTER_S)
        with contextlib.suppress(Exception):
            ends = await asyncio.wait_for(
                end_offsets(run.state.bootstrap, (DECIDERS.name, REQUESTS.name)), 10
            )
            run.extra["log_end_at_kill_deciders"] = ends[DECIDERS.name]
            run.extra["log_end_at_kill_requests"] = ends[REQUESTS.name]
        restarts = run.part("broker").restarts
        run.fault_start = run.kill("broker")
        run.fault_end = run.broker_restarted_at = await run.back("broker", restarts)
        await run.collector.restart()
        log(f"{run.name}: the collector reads the new log")
    finally:
        await traffic
    run.extra["broker_down_s"] = round(run.fault_end - run.fault_start, 2)
    run.extra["worker_restarts_in_status"] = run.part("worker").child_restarts


gateway_broker_restart = GatewayScenario(_body)
