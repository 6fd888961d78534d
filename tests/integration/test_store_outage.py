"""The feedback store off the request path: a store that is down (an HTTP DSN nobody listens on),
then the real embedded engine (chdb) on the same spool; every wait here is bounded.

The embedded engine hosts one data path per process: this module uses one (module-scoped),
read by one client, closed when the module is done.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client
from clickhouse_connect.driver.exceptions import OperationalError

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from infra import metrics
from infra.clickhouse import feedback as feedback_module
from infra.clickhouse.client import connect
from infra.clickhouse.feedback import ClickHouseFeedback, RowsLost
from infra.clickhouse.sink import FeedbackSink
from infra.kafka.broker import free_port
from schemas.events import AdmissionDecision, Completion, FleetEvent, InferenceRequest, RoutingDecision

TABLES = ("requests", "admission_decisions", "routing_decisions", "completions")
FAST = {"flush_s": 0.05, "retry_for_s": 0.5, "backoff_s": (0.05, 0.2), "close_timeout_s": 5.0}


@pytest.fixture(scope="module")
def chdb_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"chdb:///{tmp_path_factory.mktemp('store-outage') / 'clickhouse'}"


@pytest.fixture(scope="module")
def reader(chdb_url: str) -> Iterator[Client]:
    with connect(chdb_url) as client:
        yield client


def sample(name: str, **labels: str) -> float:
    value = metrics.REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def wait_until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.02)


def traffic(tag: str, n: int) -> dict[str, list[Any]]:
    """``n`` requests with their admission, routing and completion events, per table."""
    requests = [
        InferenceRequest(request_id=f"{tag}-{i}", model="m", input_tokens=100, output_budget=50)
        for i in range(n)
    ]
    admissions = [
        AdmissionDecision(
            request_id=r.request_id, tenant=r.tenant, model=r.model, slo_class="interactive",
            action="admit", reason="ok", policy="test",
        )
        for r in requests
    ]  # fmt: skip
    routings = [
        RoutingDecision(
            request_id=r.request_id, model=r.model, tenant=r.tenant, slo_class="interactive",
            dc="dc-1", instance_id="i-1", policy="test", worker="w", request=r,
            decision_latency_s=0.001,
        )
        for r in requests
    ]  # fmt: skip
    now = time.time()
    completions = [
        Completion(
            request_id=r.request_id, instance_id="i-1", model=r.model, status="ok", arrival_ts=now - 2,
            ttft_s=0.2, tpot_s=0.02, e2e_s=1.2, input_tokens=100, output_tokens=50,
        )
        for r in requests
    ]  # fmt: skip
    return {
        "requests": requests,
        "admission_decisions": admissions,
        "routing_decisions": routings,
        "completions": completions,
    }


def malformed_request(request_id: str) -> InferenceRequest:
    """A request the wire would refuse (attempt 70 000: past MAX_ATTEMPT, and past the UInt16
    column), built around the model's validation as a buggy producer in this process could."""
    valid = InferenceRequest(request_id=request_id, model="m", input_tokens=1, output_budget=1)
    return valid.model_copy(update={"attempt": 70_000})  # model_copy does not validate


async def send(store: ClickHouseFeedback, table: str, events: Sequence[Any]) -> float:
    """Hand ``events`` to the store for ``table``; returns how long the call took (s)."""
    started = time.perf_counter()
    store.write(table, events)
    return time.perf_counter() - started


def stored(client: Client, table: str, tag: str) -> tuple[int, int, set[str]]:
    """Rows of ``tag`` in ``table``: physically, after FINAL, and their event ids."""
    where = "WHERE request_id LIKE {p:String}"
    params = {"p": f"{tag}-%"}
    raw = client.query(f"SELECT count() FROM {table} {where}", parameters=params).result_rows[0][0]
    final = client.query(f"SELECT count() FROM {table} FINAL {where}", parameters=params).result_rows[0][0]
    ids = client.query(f"SELECT event_id FROM {table} FINAL {where}", parameters=params).result_rows
    return raw, final, {row[0] for row in ids}


def test_rows_spool_while_the_store_is_down_and_land_exactly_once_when_it_is_back(
    tmp_path: Path, chdb_url: str, reader: Client
) -> None:
    spool_dir = tmp_path / "spool"
    events = traffic("outage", 120)
    # A malformed event (built around the model's validation: attempt past MAX_ATTEMPT) spooled
    # with the rest: it no longer decodes when the spool drains, and is quarantined.
    malformed = malformed_request("outage-bad")
    events["requests"].insert(60, malformed)
    total = sum(len(v) for v in events.values())
    rejected_before = sample("tokenfleet_feedback_rejected_rows_total", table="requests")

    started = time.monotonic()
    down = ClickHouseFeedback(
        f"http://127.0.0.1:{free_port()}", DEFAULT_SLO_CLASSES, spool_dir=spool_dir, **FAST
    )
    assert time.monotonic() - started < 1.0  # starts without its store

    async def enqueue_all(store: ClickHouseFeedback, batch: int) -> list[float]:
        took = []
        for table in TABLES:
            rows = events[table]
            for i in range(0, len(rows), batch):
                took.append(await send(store, table, rows[i : i + batch]))
        # a redelivered copy of some completions: harmless
        took.append(await send(store, "completions", events["completions"][:5]))
        return took

    try:
        took = asyncio.run(enqueue_all(down, 10))
        assert max(took) < 0.010, f"slowest enqueue {max(took) * 1000:.1f} ms while the store is down"
        wait_until(lambda: down.spooled_rows == total + 5, 10, "every row spooled")
        assert not down.store_up
        assert sample("tokenfleet_feedback_store_up") == 0
        assert sample("tokenfleet_feedback_spooled_rows") == total + 5
        assert down.buffered_rows == 0
    finally:
        started = time.monotonic()
        down.close()
        assert time.monotonic() - started < 3.0  # a store that is down is not waited for
    on_disk = sum(len(p.read_bytes().splitlines()) for p in spool_dir.glob("0*.jsonl"))
    assert on_disk == total + 5

    # The store is back: a new worker on the same spool drains it.
    up = ClickHouseFeedback(chdb_url, DEFAULT_SLO_CLASSES, spool_dir=spool_dir, batch_size=40, **FAST)
    try:
        assert up.flush(60), f"spool not drained: {up.spooled_rows} rows left"
        assert up.store_up and sample("tokenfleet_feedback_store_up") == 1
        assert sample("tokenfleet_feedback_spooled_rows") == 0
        assert list(spool_dir.glob("0*.jsonl")) == []
        for table in TABLES:
            good = {e.event_id for e in events[table] if e is not malformed}
            raw, final, ids = stored(reader, table, "outage")
            assert (raw, final) == (len(good), len(good)), table  # each exactly once
            assert ids == good, table
        # the malformed row did not block the rows after it: quarantined, with its error
        assert sample("tokenfleet_feedback_rejected_rows_total", table="requests") == rejected_before + 1
        (line,) = (spool_dir / "rejected-requests.jsonl").read_text().splitlines()
        record = json.loads(line)
        assert malformed.event_id in record["line"] and "attempt" in record["error"]
        # Sent again (a stream redelivery): still once.
        asyncio.run(send(up, "completions", events["completions"]))
        assert up.flush(30)
        raw, final, _ids = stored(reader, "completions", "outage")
        assert raw == final == len(events["completions"])
        rollup = reader.query("SELECT sum(completions) FROM goodput_per_minute").result_rows[0][0]
        assert rollup == len(events["completions"])  # the roll-up never saw a duplicate
    finally:
        up.close()


def test_fleet_events_spool_while_the_store_is_down_and_land_once_when_it_is_back(
    tmp_path: Path, chdb_url: str, reader: Client
) -> None:
    spool_dir = tmp_path / "spool"
    events = [
        FleetEvent(kind="dc_down", dc=f"dc-{k}", model="fleet-outage", detail="0 of 2 ready", worker="w")
        for k in range(30)
    ]
    down = ClickHouseFeedback(
        f"http://127.0.0.1:{free_port()}", DEFAULT_SLO_CLASSES, spool_dir=spool_dir, **FAST
    )
    try:
        down.write("fleet_events", events)
        wait_until(lambda: down.spooled_rows == len(events), 10, "every fleet event spooled")
    finally:
        down.close()
    up = ClickHouseFeedback(chdb_url, DEFAULT_SLO_CLASSES, spool_dir=spool_dir, **FAST)
    try:
        up.write("fleet_events", events[:5])  # a redelivered copy: harmless
        assert up.flush(60), f"spool not drained: {up.spooled_rows} rows left"
    finally:
        up.close()
    where = "WHERE model = 'fleet-outage'"
    raw = reader.query(f"SELECT count() FROM fleet_events {where}").result_rows[0][0]
    ids = {row[0] for row in reader.query(f"SELECT event_id FROM fleet_events FINAL {where}").result_rows}
    assert raw == len(events) and ids == {e.event_id for e in events}


def test_a_malformed_row_is_quarantined_and_later_rows_still_land(
    tmp_path: Path, chdb_url: str, reader: Client
) -> None:
    store = ClickHouseFeedback(
        chdb_url, DEFAULT_SLO_CLASSES, spool_dir=tmp_path / "spool", batch_size=64, **FAST
    )
    try:
        wait_until(lambda: store.store_up, 30, "the store connected")
        rows = traffic("perm", 40)["requests"]
        bad = malformed_request("perm-bad")  # attempt does not fit the UInt16 column: DataError
        bad_ts = Completion.model_construct(
            **{**traffic("perm-late", 1)["completions"][0].model_dump(), "deadline_ts": 1e13}
        )  # a deadline past year 9999: the sink cannot convert it (ValueError)
        asyncio.run(send(store, "requests", [*rows[:20], bad, *rows[20:30]]))
        asyncio.run(send(store, "completions", [bad_ts]))
        asyncio.run(send(store, "requests", rows[30:]))
        assert store.flush(30)
        raw, final, ids = stored(reader, "requests", "perm")
        assert (raw, final) == (40, 40) and ids == {r.event_id for r in rows}
        assert stored(reader, "completions", "perm") == (0, 0, set())
        rejected = [
            json.loads(line) for line in store.spool.rejected_path("requests").read_text().splitlines()
        ]
        assert [r["event"]["event_id"] for r in rejected] == [bad.event_id]
        assert "DataError" in rejected[0]["error"]
        late = json.loads(store.spool.rejected_path("completions").read_text())
        assert late["event"]["request_id"] == "perm-late-0" and late["error"].startswith("ValueError")
        assert store.spooled_rows == 0
    finally:
        store.close()


def test_close_flushes_everything_to_a_healthy_store(tmp_path: Path, chdb_url: str, reader: Client) -> None:
    events = traffic("close", 25)
    store = ClickHouseFeedback(
        chdb_url, DEFAULT_SLO_CLASSES, spool_dir=tmp_path / "spool", **{**FAST, "flush_s": 30.0}
    )

    async def enqueue() -> None:
        for table in TABLES:
            await send(store, table, events[table])

    wait_until(lambda: store.store_up, 30, "the store connected")
    asyncio.run(enqueue())
    started = time.monotonic()
    store.close()  # flush_s is far away: close itself writes them
    assert time.monotonic() - started < 5.0
    for table in TABLES:
        assert stored(reader, table, "close")[:2] == (25, 25), table
    assert list((tmp_path / "spool").glob("0*.jsonl")) == []


class FlakySink(FeedbackSink):
    """The real sink, whose inserts fail (inside its retry loop) while ``outage`` is set."""

    outage = threading.Event()

    def _insert_new(self, table: str, columns: Sequence[str], rows: Any) -> int:
        if FlakySink.outage.is_set():
            raise OperationalError("injected outage: connection refused")
        return super()._insert_new(table, columns, rows)


def test_an_outage_mid_run_spools_after_the_retry_budget_and_loses_nothing(
    tmp_path: Path, chdb_url: str, reader: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feedback_module, "FeedbackSink", FlakySink)
    FlakySink.outage.clear()
    before, during = traffic("midrun-a", 30), traffic("midrun-b", 60)
    store = ClickHouseFeedback(
        chdb_url, DEFAULT_SLO_CLASSES, spool_dir=tmp_path / "spool", batch_size=50, **FAST
    )

    async def enqueue(events: dict[str, list[Any]]) -> list[float]:
        return [
            await send(store, table, events[table][i : i + 10]) for table in TABLES for i in range(0, 60, 10)
        ]

    try:
        wait_until(lambda: store.store_up, 30, "the store connected")
        asyncio.run(enqueue(before))
        assert store.flush(30)
        FlakySink.outage.set()
        took = asyncio.run(enqueue(during))
        assert max(took) < 0.010, f"slowest enqueue {max(took) * 1000:.1f} ms during the outage"
        total = sum(len(v) for v in during.values())
        # each write fails after the sink's retry budget (0.5 s): its rows spool, none dropped
        wait_until(lambda: not store.store_up, 10, "the store seen down")
        wait_until(lambda: store.spooled_rows == total, 10, "every row of the outage spooled")
        FlakySink.outage.clear()
        assert store.flush(30), f"not drained: {store.spooled_rows} spooled, {store.buffered_rows} buffered"
        for events, tag in ((before, "midrun-a"), (during, "midrun-b")):
            for table in TABLES:
                raw, final, ids = stored(reader, table, tag)
                assert raw == final == len(events[table]) and ids == {e.event_id for e in events[table]}
    finally:
        FlakySink.outage.clear()
        store.close()


def test_a_write_is_acknowledged_once_its_rows_are_durable_and_refused_when_they_are_dropped(
    tmp_path: Path, chdb_url: str, reader: Client
) -> None:
    """The receipt of ``write`` (what the topic sink commits offsets by): done once the rows are
    in the spool (store down) or in ClickHouse (store up); ``RowsLost`` when the buffer dropped some."""
    spool_dir = tmp_path / "spool"
    events = traffic("receipt", 30)["completions"]
    down = ClickHouseFeedback(
        f"http://127.0.0.1:{free_port()}", DEFAULT_SLO_CLASSES, spool_dir=spool_dir, buffer_rows=20, **FAST
    )
    try:
        assert down.write("completions", events[:10]).result(timeout=10) is None
        assert down.spooled_rows == 10  # acknowledged: fsync'd to the spool
        with pytest.raises(RowsLost):
            down.write("completions", events[:30] * 2).result(timeout=10)  # 60 rows: 40 past the buffer
    finally:
        down.close()
    up = ClickHouseFeedback(chdb_url, DEFAULT_SLO_CLASSES, spool_dir=tmp_path / "spool-up", **FAST)
    try:
        wait_until(lambda: up.store_up, 30, "the store connected")
        assert up.write("completions", events[:5]).result(timeout=30) is None
        assert stored(reader, "completions", "receipt")[2] >= {e.event_id for e in events[:5]}
    finally:
        up.close()
