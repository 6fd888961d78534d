"""The topic sink on the session's real broker (Tansu) and the real embedded ClickHouse engine
(chdb): rows published to the topics are stored once; a sink that dies before the store
acknowledged loses nothing; offsets never pass rows the store has not acknowledged.

Every test uses a consumer group and row ids of its own; the topics are the session's, so a
sink also reads (and stores) other tests' messages: every check filters by the test's ids.
The embedded engine hosts one data path per process: this module uses one (module-scoped).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from clickhouse_connect.driver.client import Client

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from infra.clickhouse.client import connect
from infra.clickhouse.feedback import ClickHouseFeedback, RowsLost
from infra.clickhouse.topic_sink import TOPIC_TABLES, TopicSink
from infra.kafka.broker import free_port
from infra.kafka.connection import KafkaConnection
from schemas import topics
from schemas.codec import encode
from schemas.events import (
    AdmissionDecision,
    Completion,
    Event,
    FleetEvent,
    Heartbeat,
    InferenceRequest,
    RoutingDecision,
)
from schemas.topics import TopicSpec, key_of
from tests.integration.streaming import unique

FAST = {"flush_s": 0.05, "retry_for_s": 0.5, "backoff_s": (0.05, 0.2), "close_timeout_s": 5.0}
GROUP = {"session_timeout_s": 6.0, "rebalance_timeout_s": 2.0, "heartbeat_interval_s": 0.5}
TABLE_OF = {spec.name: table for spec, table in TOPIC_TABLES.items()}


@pytest.fixture(scope="module")
def chdb_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"chdb:///{tmp_path_factory.mktemp('topic-sink') / 'clickhouse'}"


@pytest.fixture(scope="module")
def reader(chdb_url: str) -> Iterator[Client]:
    with connect(chdb_url) as client:
        yield client


@pytest.fixture
def store(chdb_url: str, tmp_path: Path) -> Iterator[ClickHouseFeedback]:
    opened = ClickHouseFeedback(chdb_url, DEFAULT_SLO_CLASSES, spool_dir=tmp_path / "spool", **FAST)
    try:
        deadline = time.monotonic() + 30
        while not opened.store_up:  # connected and migrated: the tables exist
            assert time.monotonic() < deadline, "the store did not come up"
            time.sleep(0.02)
        yield opened
    finally:
        opened.close()


def traffic(tag: str, n: int) -> dict[TopicSpec, list[Event]]:
    """``n`` requests with their admissions, routings and completions, a heartbeat and a fleet
    event per request: one row for every table the sink fills."""
    requests = [
        InferenceRequest(request_id=f"{tag}-{i}", model=tag, input_tokens=100, output_budget=50)
        for i in range(n)
    ]
    now = time.time()
    return {
        topics.REQUESTS: list(requests),
        topics.ADMISSION: [
            AdmissionDecision(
                request_id=r.request_id, tenant=r.tenant, model=r.model, slo_class="interactive",
                action="admit", reason="ok", policy="test",
            )
            for r in requests
        ],
        topics.DECISIONS: [
            RoutingDecision(
                request_id=r.request_id, model=r.model, tenant=r.tenant, slo_class="interactive",
                dc="dc-1", instance_id="i-1", policy="test", worker="w", request=r, decision_latency_s=0.001,
            )
            for r in requests
        ],
        topics.COMPLETIONS: [
            Completion(
                request_id=r.request_id, instance_id="i-1", model=r.model, status="ok", arrival_ts=now - 2,
                ttft_s=0.2, tpot_s=0.02, e2e_s=1.2, input_tokens=100, output_tokens=50,
            )
            for r in requests
        ],
        topics.HEARTBEATS: [
            Heartbeat(
                instance_id=f"{tag}-i{i}", dc="dc-1", model=tag, model_version="v1", waiting=0, running=0,
                tokens_in_flight=0, kv_blocks_used=0, kv_blocks_total=100,
            )
            for i in range(n)
        ],
        topics.FLEET_EVENTS: [FleetEvent(kind="dc_up", dc="dc-1", model=tag) for _ in range(n)],
    }  # fmt: skip


def ids(events: dict[TopicSpec, list[Event]]) -> dict[str, set[str]]:
    return {TABLE_OF[spec.name]: {e.event_id for e in rows} for spec, rows in events.items()}


Placed = dict[TopicPartition, list[int]]
"""Where the published messages landed: their offsets per partition."""


async def publish(bootstrap: str, events: dict[TopicSpec, list[Event]], extra: Sequence[Any] = ()) -> Placed:
    """Publish every event (and the raw ``(spec, key, value)`` of ``extra``); wait until the
    broker has them all."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = [
            await producer.send(spec.name, encode(e), key=key_of(spec, e))
            for spec, rows in events.items()
            for e in rows
        ]
        sent += [await producer.send(spec.name, value, key=key) for spec, key, value in extra]
        placed: Placed = defaultdict(list)
        for meta in await asyncio.gather(*sent):
            placed[TopicPartition(meta.topic, meta.partition)].append(meta.offset)
        return placed
    finally:
        await producer.stop()


def stored(reader: Client, table: str, event_ids: set[str]) -> tuple[int, set[str]]:
    """Rows of ``event_ids`` in ``table``: physically (a duplicate counts twice), and their ids."""
    rows = reader.query(
        f"SELECT event_id FROM {table} WHERE event_id IN {{ids:Array(String)}}",
        parameters={"ids": sorted(event_ids)},
    ).result_rows
    return len(rows), {row[0] for row in rows}


def all_stored(reader: Client, expected: dict[str, set[str]]) -> bool:
    return all(stored(reader, table, want)[1] == want for table, want in expected.items())


async def until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


def sink(broker: str, group: str, row_store: Any) -> TopicSink:
    return TopicSink(
        KafkaConnection.plaintext(broker), group, row_store, **GROUP, revoke_grace_s=1.0, retry_s=0.2
    )


class Scripted:
    """A ``RowStore`` in front of another: records what it is handed, and answers as told."""

    def __init__(self, behind: ClickHouseFeedback | None) -> None:
        self.behind = behind
        self.handed: dict[str, list[Event]] = defaultdict(list)
        self.answer: Callable[[str, Sequence[Event]], Future[None]] = self.forward
        self.held: list[tuple[str, Sequence[Event], Future[None]]] = []

    def write(self, table: str, events: Sequence[Event]) -> Future[None]:
        self.handed[table].extend(events)
        return self.answer(table, events)

    def forward(self, table: str, events: Sequence[Event]) -> Future[None]:
        assert self.behind is not None
        return self.behind.write(table, events)

    def hold(self, table: str, events: Sequence[Event]) -> Future[None]:
        """Never acknowledged until ``release`` (a process whose memory still has the rows)."""
        future: Future[None] = Future()
        self.held.append((table, events, future))
        return future

    def release(self) -> None:
        for table, events, future in self.held:
            self.forward(table, events).add_done_callback(lambda done, f=future: _copy(done, f))
        self.held = []

    def has(self, expected: dict[str, set[str]]) -> bool:
        return all(want <= {e.event_id for e in self.handed[t]} for t, want in expected.items())


def _copy(source: Future[None], target: Future[None]) -> None:
    error = source.exception()
    if error is None:
        target.set_result(None)
    else:
        target.set_exception(error)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_rows_published_to_the_topics_are_stored_once(
    broker: str, store: ClickHouseFeedback, reader: Client
) -> None:
    tag = unique("once")
    events = traffic(tag, 30)
    # Redelivered copies, and a message that does not decode: skipped (the DLQ is not the sink's).
    again = {topics.COMPLETIONS: events[topics.COMPLETIONS][:5], topics.REQUESTS: events[topics.REQUESTS][:5]}
    expected = ids(events)

    async def scenario() -> None:
        placed = await publish(broker, events, extra=[(topics.COMPLETIONS, tag.encode(), b"{not json")])
        placed_again = await publish(broker, again)
        consumer = sink(broker, unique("store"), store)
        await consumer.start()
        try:
            await until(lambda: all_stored(reader, expected), 20, "every row stored")
            last = {tp: max(offsets) for tp, offsets in [*placed.items(), *placed_again.items()]}
            await until(
                lambda: all(consumer.committed.get(tp, -1) > offset for tp, offset in last.items()),
                30,
                "the offsets committed past every message",
            )
        finally:
            await consumer.stop()

    run(scenario)
    for table, want in expected.items():
        assert stored(reader, table, want) == (len(want), want), table  # each row exactly once


def test_a_sink_that_dies_before_the_store_acknowledged_loses_nothing(
    broker: str, store: ClickHouseFeedback, reader: Client
) -> None:
    """The first sink's store writes the first rows it is handed through to ClickHouse and then
    keeps the rest in memory, never acknowledged; the sink is abandoned (no grace to wait for
    acknowledgements): a second sink of the same group stores the rest, nothing twice."""
    tag = unique("dies")
    events = traffic(tag, 60)
    expected = ids(events)
    group = unique("store")
    dying = Scripted(store)
    writes = 0

    def first_writes_then_hold(table: str, rows: Sequence[Event]) -> Future[None]:
        nonlocal writes
        writes += 1
        return dying.forward(table, rows) if writes <= 2 else dying.hold(table, rows)

    dying.answer = first_writes_then_hold

    async def scenario() -> None:
        await publish(broker, events)
        first = sink(broker, group, dying)
        await first.start()
        try:
            await until(lambda: dying.has(expected), 60, "the first sink read every row")
        finally:
            await first.stop(grace_s=0.0)  # dies: what its store holds in memory is gone
        assert dying.held, "the first sink's store held rows when it died"
        second = sink(broker, group, store)
        await second.start()
        try:
            await until(lambda: all_stored(reader, expected), 60, "every row stored by the second sink")
        finally:
            await second.stop()

    run(scenario)
    for table, want in expected.items():
        assert stored(reader, table, want) == (len(want), want), table


def test_offsets_are_not_committed_past_rows_the_store_has_not_acknowledged(
    broker: str, store: ClickHouseFeedback, reader: Client
) -> None:
    """While the store acknowledges nothing, the committed offsets stay before the rows; a write
    the store lost (``RowsLost``) is read again; once it acknowledges, everything is stored
    once and the offsets pass the rows."""
    tag = unique("held")
    events = traffic(tag, 20)
    expected = ids(events)
    gated = Scripted(store)
    lost_once: list[str] = []

    def lose_one_then_hold(table: str, rows: Sequence[Event]) -> Future[None]:
        if table == "completions" and not lost_once:  # the store lost these rows (its buffer was full)
            lost_once.append(table)
            future: Future[None] = Future()
            future.set_exception(RowsLost("test"))
            return future
        return gated.hold(table, rows)

    gated.answer = lose_one_then_hold

    async def scenario() -> None:
        placed = await publish(broker, events)
        first = {tp: min(offsets) for tp, offsets in placed.items()}
        last = {tp: max(offsets) for tp, offsets in placed.items()}
        consumer = sink(broker, unique("store"), gated)
        await consumer.start()
        try:
            await until(lambda: gated.has(expected), 60, "the sink read every row")
            await asyncio.sleep(1.0)  # time to commit, were it to
            assert all(consumer.committed.get(tp, 0) <= offset for tp, offset in first.items())
            gated.answer = gated.forward
            gated.release()
            await until(lambda: all_stored(reader, expected), 20, "every row stored")
            await until(
                lambda: all(consumer.committed.get(tp, -1) > offset for tp, offset in last.items()),
                30,
                "the offsets committed past every message",
            )
        finally:
            await consumer.stop()

    run(scenario)
    assert lost_once, "a write was lost, and read again"
    for table, want in expected.items():
        assert stored(reader, table, want) == (len(want), want), table


def test_rows_spool_while_the_store_is_down_and_are_stored_once_when_it_is_back(
    broker: str, chdb_url: str, reader: Client, tmp_path: Path
) -> None:
    """The store is down (nothing listens at its URL): the rows are fsync'd to the spool, which
    acknowledges them, so the offsets move on; a store on the same spool, once up, stores them."""
    tag = unique("down")
    events = traffic(tag, 25)
    expected = ids(events)
    spool = tmp_path / "down-spool"
    down = ClickHouseFeedback(f"http://127.0.0.1:{free_port()}", DEFAULT_SLO_CLASSES, spool_dir=spool, **FAST)

    async def scenario() -> None:
        placed = await publish(broker, events)
        last = {tp: max(offsets) for tp, offsets in placed.items()}
        consumer = sink(broker, unique("store"), down)
        await consumer.start()
        try:
            await until(
                lambda: all(consumer.committed.get(tp, -1) > offset for tp, offset in last.items()),
                60,
                "the offsets committed once the rows were spooled",
            )
        finally:
            await consumer.stop()

    try:
        run(scenario)
        assert not down.store_up and down.spooled_rows >= sum(len(want) for want in expected.values())
    finally:
        down.close()
    up = ClickHouseFeedback(chdb_url, DEFAULT_SLO_CLASSES, spool_dir=spool, **FAST)
    try:
        assert up.flush(60), f"spool not drained: {up.spooled_rows} rows left"
    finally:
        up.close()
    for table, want in expected.items():
        assert stored(reader, table, want) == (len(want), want), table
