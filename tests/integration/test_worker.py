"""The streaming worker against the real embedded broker (Tansu) and ClickHouse engine (chdb)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from infra.clickhouse.client import connect
from schemas.codec import encode
from schemas.events import AdmissionDecision, Completion, DeadLetter, Event, InferenceRequest, RoutingDecision
from schemas.topics import ADMISSION, COMPLETIONS, DECISIONS, DLQ, HEARTBEATS, REQUESTS
from tests.integration.streaming import Collector, heartbeat, publish, request, unique
from tests.integration.streaming import worker as worker_process


def event_id(value: bytes) -> str:
    return str(json.loads(value)["event_id"])


E = TypeVar("E", bound=Event)


def once_each(kind: type[E], raw: list[bytes]) -> list[E]:
    """The events in ``raw``, each once: a decision published again (a redelivered request
    answered with the decision it had) keeps its event id and must be the same decision."""
    kept: dict[str, E] = {}
    for value in raw:
        event = kind.model_validate_json(value)
        first = kept.setdefault(event.event_id, event)
        assert first == event, f"event {event.event_id} published with two contents"
    return list(kept.values())


def decisions(raw: list[bytes]) -> list[RoutingDecision]:
    return once_each(RoutingDecision, raw)


def test_held_request_is_routed_on_the_first_heartbeat_and_each_request_decided_once(
    broker: str, tmp_path: Path
) -> None:
    pool = unique("pool")
    worker = worker_process(broker, unique("app"), tmp_path)
    try:
        worker.wait_ready()

        async def scenario() -> tuple[list[bytes], list[bytes]]:
            async with (
                Collector(broker, DECISIONS, pool.encode()) as routed,
                Collector(broker, ADMISSION, pool.encode()) as admitted,
            ):
                # Before any heartbeat the pool has no instances: the request is held, not lost.
                await publish(broker, REQUESTS, [request(pool, "early")])
                await admitted.wait_for(1)
                assert routed.values == []
                # Only a heartbeat arrives, no further request: the held request is routed.
                await publish(broker, HEARTBEATS, [heartbeat(pool, "i-1")])
                await routed.wait_for(1, timeout_s=15.0)
                await publish(broker, REQUESTS, [request(pool, "r-1")])
                await routed.wait_for(2)
                await asyncio.sleep(2.0)  # anything extra would show up now
                return routed.values, admitted.values

        routed_raw, admitted_raw = asyncio.run(scenario())
    finally:
        worker.stop()
    routed = decisions(routed_raw)
    assert sorted(d.request_id for d in routed) == ["early", "r-1"]
    assert all(d.instance_id == "i-1" and d.dc == "dc-1" for d in routed)
    answers = [AdmissionDecision.model_validate_json(v) for v in admitted_raw]
    actions = [(a.request_id, a.action, a.queue_pool) for a in answers]
    assert actions == [("early", "queue", "no_capacity"), ("early", "admit", ""), ("r-1", "admit", "")]


def test_bad_events_go_to_the_dlq_and_the_stream_goes_on(broker: str, tmp_path: Path) -> None:
    pool = unique("pool")
    key = pool.encode()
    not_json = b"{not json " + key
    invalid = b'{"request_id": "x", "model": "' + key + b'", "input_tokens": -1, "output_budget": 5}'
    worker = worker_process(broker, unique("app"), tmp_path)
    try:
        worker.wait_ready()

        async def scenario() -> tuple[list[bytes], list[bytes]]:
            async with (
                Collector(broker, DECISIONS, key) as routed,
                Collector(broker, DLQ, REQUESTS.name.encode()) as dead,
            ):
                await publish(broker, HEARTBEATS, [heartbeat(pool, "i-1")])
                await asyncio.sleep(1.0)
                events = [request(pool, "before"), (key, not_json), (key, invalid), request(pool, "after")]
                await publish(broker, REQUESTS, events)
                await routed.wait_for(2)
                await dead.wait_for(2)
                await asyncio.sleep(1.0)
                return routed.values, dead.values

        routed_raw, dead_raw = asyncio.run(scenario())
    finally:
        worker.stop()
    assert sorted(d.request_id for d in decisions(routed_raw)) == ["after", "before"]
    letters = [DeadLetter.model_validate_json(v) for v in dead_raw]
    ours = {base64.b64decode(d.original_b64): d for d in letters if key in base64.b64decode(d.original_b64)}
    assert set(ours) == {not_json, invalid}
    assert ours[not_json].reason.startswith("invalid JSON")
    assert "input_tokens" in ours[invalid].reason
    assert all(d.source_topic == REQUESTS.name for d in ours.values())


def test_redelivered_completions_reach_clickhouse_once(broker: str, tmp_path: Path) -> None:
    pool = unique("pool")
    store = f"chdb:///{tmp_path / 'clickhouse'}"
    completion = Completion(
        request_id=unique("req"),
        instance_id="i-1",
        model=pool,
        status="ok",
        arrival_ts=time.time() - 2,
        ttft_s=0.3,
        tpot_s=0.02,
        e2e_s=2.0,
        input_tokens=1000,
        output_tokens=85,
    )
    worker = worker_process(broker, unique("app"), tmp_path, clickhouse=store)
    try:
        worker.wait_ready()
        asyncio.run(publish(broker, COMPLETIONS, [completion, completion]))  # redelivered
        time.sleep(3.0)
        asyncio.run(publish(broker, COMPLETIONS, [completion]))  # and again, later
        time.sleep(3.0)
    finally:
        worker.stop()  # the embedded store admits one process at a time
    client = connect(store)
    try:
        rows = client.query(
            "SELECT count(), sum(output_tokens) FROM completions FINAL WHERE request_id = {r:String}",
            parameters={"r": completion.request_id},
        ).result_rows
        # Other tests' completions share the topic and land here too: compare totals.
        stored = client.query("SELECT count() FROM completions FINAL").result_rows
        rollup = client.query("SELECT sum(completions) FROM goodput_per_minute").result_rows
    finally:
        client.close()
    assert rows == [(1, 85)]
    assert rollup == stored  # the roll-up never counted a redelivered completion


def test_restarted_worker_recovers_its_tables_and_loses_no_request(broker: str, tmp_path: Path) -> None:
    pool = unique("pool")
    app_id = unique("app")
    first = worker_process(broker, app_id, tmp_path)
    ids = [f"r{i}" for i in range(60)]

    async def scenario() -> list[bytes]:
        async with Collector(broker, DECISIONS, pool.encode()) as routed:
            await asyncio.to_thread(first.wait_ready)
            await publish(broker, HEARTBEATS, [heartbeat(pool, "i-1"), heartbeat(pool, "i-2")])
            await asyncio.sleep(1.0)
            await publish(broker, REQUESTS, [request(pool, r) for r in ids[:30]])
            await routed.wait_for(10)
            # Kill it mid-stream: no goodbye, offsets possibly uncommitted.
            sender = asyncio.create_task(publish(broker, REQUESTS, [request(pool, r) for r in ids[30:]]))
            first.stop(kill=True)
            await sender
            # The new worker gets no heartbeat: it can route only if it recovered the table.
            second = worker_process(broker, app_id, tmp_path)
            try:
                await asyncio.to_thread(second.wait_ready)
                await routed.wait_for(len(ids), timeout_s=40, by=event_id)
                await asyncio.sleep(1.0)
            finally:
                second.stop()
            return routed.values

    routed = decisions(asyncio.run(scenario()))
    assert sorted(d.request_id for d in routed) == sorted(ids)  # nothing lost, nothing decided twice
    assert {d.instance_id for d in routed} == {"i-1", "i-2"}
    assert len({d.worker for d in routed}) == 2  # both incarnations routed some


def test_requests_held_across_a_restart_are_decided_once_by_the_next_worker(
    broker: str, tmp_path: Path
) -> None:
    pool = unique("pool")
    app_id = unique("app")
    ids = [f"h{i}" for i in range(50)]

    async def scenario() -> tuple[list[bytes], list[bytes]]:
        async with (
            Collector(broker, DECISIONS, pool.encode()) as routed,
            Collector(broker, ADMISSION, pool.encode()) as answered,
        ):
            first = worker_process(broker, app_id, tmp_path)
            try:
                await asyncio.to_thread(first.wait_ready)
                await publish(broker, REQUESTS, [request(pool, r) for r in ids])  # no instance yet
                await answered.wait_for(len(ids))
                await asyncio.sleep(1.0)  # the lane commits (but not past the held requests)
            finally:
                first.stop()  # a graceful restart
            assert routed.values == []
            second = worker_process(broker, app_id, tmp_path)
            try:
                await asyncio.to_thread(second.wait_ready)
                await publish(broker, HEARTBEATS, [heartbeat(pool, "i-1")])
                await routed.wait_for(len(ids), timeout_s=30, by=event_id)
                await asyncio.sleep(1.0)  # anything decided twice would show up now
            finally:
                second.stop()
            return routed.values, answered.values

    routed_raw, answered_raw = asyncio.run(scenario())
    assert sorted(d.request_id for d in decisions(routed_raw)) == sorted(ids)
    admitted = [a for a in once_each(AdmissionDecision, answered_raw) if a.action == "admit"]
    assert sorted(a.request_id for a in admitted) == sorted(ids)


def test_two_workers_share_partitions_and_rebalance(broker: str, tmp_path: Path) -> None:
    app_id = unique("app")
    pools = [unique("pool") for _ in range(12)]  # spread over the 4 partitions
    one, two = worker_process(broker, app_id, tmp_path / "a"), worker_process(broker, app_id, tmp_path / "b")

    async def routed_by(round_id: str) -> dict[str, set[str]]:
        """Which worker routed each pool's request in this round."""
        wanted = {f"{round_id}-{p}" for p in pools}
        async with Collector(broker, DECISIONS, *(p.encode() for p in pools)) as routed:
            await publish(broker, REQUESTS, [request(p, f"{round_id}-{p}") for p in pools])
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                seen = [d for d in decisions(routed.values) if d.request_id in wanted]
                if {d.request_id for d in seen} == wanted:
                    break
                await asyncio.sleep(0.2)
        by_worker: dict[str, set[str]] = {}
        for d in seen:
            by_worker.setdefault(d.worker, set()).add(d.model)
        return by_worker

    async def scenario() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
        await asyncio.to_thread(one.wait_ready)
        await asyncio.to_thread(two.wait_ready)
        await publish(broker, HEARTBEATS, [heartbeat(p, "i-1") for p in pools])
        await asyncio.sleep(8.0)  # both members settled in the group
        shared = await routed_by("both")
        two.stop()  # leaves: its partitions move to the other worker
        await asyncio.sleep(8.0)
        alone = await routed_by("alone")
        return shared, alone

    try:
        shared, alone = asyncio.run(scenario())
    finally:
        one.stop()
        two.stop()
    assert len(shared) == 2, shared  # the partitions were split between the two workers
    assert set().union(*shared.values()) == set(pools)
    assert len(alone) == 1 and next(iter(alone.values())) == set(pools), one.log()


def test_prometheus_metrics_are_served_with_the_clickhouse_sink_off(broker: str, tmp_path: Path) -> None:
    pool = unique("pool")
    worker = worker_process(broker, unique("app"), tmp_path, clickhouse="off")
    try:
        worker.wait_ready()

        async def scenario() -> None:
            async with Collector(broker, DECISIONS, pool.encode()) as routed:
                await publish(broker, HEARTBEATS, [heartbeat(pool, "i-1")])
                await asyncio.sleep(1.0)
                await publish(broker, REQUESTS, [request(pool, "r-1"), request(pool, "r-2")])
                await routed.wait_for(2)

        asyncio.run(scenario())
        with urllib.request.urlopen(worker.metrics_url(), timeout=10) as response:
            text = response.read().decode()
    finally:
        worker.stop()
    admitted = {
        sample.labels["policy"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "tokenfleet_decisions_total" and sample.labels.get("outcome") == "admit"
    }
    assert admitted.get("least-request", 0) >= 2, text[:2000]


def test_a_pools_decisions_keep_the_order_of_its_requests(broker: str, tmp_path: Path) -> None:
    """Small lane batches, many of them awaiting delivery at once: the order holds across them."""
    pool = unique("pool")
    ids = [f"r{i:04d}" for i in range(400)]
    worker = worker_process(broker, unique("app"), tmp_path, settings={"TOKENFLEET_REQUEST_BATCH_MAX": "7"})
    try:
        worker.wait_ready()

        async def scenario() -> list[bytes]:
            async with Collector(broker, DECISIONS, pool.encode()) as routed:
                await publish(broker, HEARTBEATS, [heartbeat(pool, "i-1"), heartbeat(pool, "i-2")])
                await asyncio.sleep(1.0)
                producer = AIOKafkaProducer(bootstrap_servers=broker, linger_ms=20)
                await producer.start()
                try:  # one burst: the lane reads it in batches of 7
                    sent = [
                        await producer.send(REQUESTS.name, encode(request(pool, r)), key=pool.encode())
                        for r in ids
                    ]
                    await asyncio.gather(*sent)
                finally:
                    await producer.stop()
                return await routed.wait_for(len(ids))

        routed = decisions(asyncio.run(scenario()))
    finally:
        worker.stop()
    assert [d.request_id for d in routed] == ids


def test_a_worker_answers_its_probes(broker: str, tmp_path: Path) -> None:
    """/health says live, /ready says it consumes."""
    worker = worker_process(broker, unique("app"), tmp_path)
    try:
        worker.wait_ready()
        answers = {}
        for path in ("/health", "/ready"):
            deadline = time.monotonic() + 15
            while True:
                try:
                    with urllib.request.urlopen(worker.probe_url(path), timeout=5) as response:
                        answers[path] = (response.status, response.read())
                        break
                except urllib.error.HTTPError:  # /ready: 503 until the lane's first fetch
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
    finally:
        worker.stop()
    assert answers["/health"][0] == 200 and json.loads(answers["/health"][1]) == {"live": True}
    assert answers["/ready"][0] == 200 and json.loads(answers["/ready"][1])["consuming"] is True


def observed_placements(worker: Any, pool: str) -> float:
    """The worker's ``tokenfleet_placements_observed_total`` for ``pool``."""
    with urllib.request.urlopen(worker.metrics_url(), timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "tokenfleet_placements_observed_total" and sample.labels.get("pool") == pool
    )


def test_two_workers_decide_for_one_pool_each_counting_the_others_placements(
    broker: str, tmp_path: Path
) -> None:
    """One pool's requests spread over the partitions by their prompt prefix: both workers of
    the group decide for it at once, each request once, and each worker accounts for the
    placements the other made (read from ``tf.decisions``)."""
    app_id, pool = unique("app"), unique("pool")
    one, two = worker_process(broker, app_id, tmp_path / "a"), worker_process(broker, app_id, tmp_path / "b")
    ids = [f"r{i:03d}" for i in range(40)]

    async def scenario() -> list[RoutingDecision]:
        await asyncio.to_thread(one.wait_ready)
        await asyncio.to_thread(two.wait_ready)
        await publish(broker, HEARTBEATS, [heartbeat(pool, "i-1"), heartbeat(pool, "i-2")])
        await asyncio.sleep(8.0)  # both members settled in the deciders' group
        async with Collector(broker, DECISIONS, pool.encode()) as routed:
            prefixes = [(1000 + i, 2000 + i) for i in range(len(ids))]  # one prefix each
            requests = [
                InferenceRequest(
                    request_id=rid, model=pool, input_tokens=1000, output_budget=9, prompt_block_hashes=prefix
                )
                for rid, prefix in zip(ids, prefixes, strict=True)
            ]
            await publish(broker, REQUESTS, requests)
            await routed.wait_for(len(ids))
            await asyncio.sleep(2.0)  # anything decided twice would show up now
            return decisions(routed.values)

    try:
        routed = asyncio.run(scenario())
        by_worker = Counter(d.worker for d in routed)
        seen_by = {w.pid: observed_placements(w, pool) for w in (one, two)}
    finally:
        one.stop()
        two.stop()
    assert sorted(d.request_id for d in routed) == ids  # every request decided, once
    assert len(by_worker) == 2, by_worker  # both workers decided for the one pool
    # Each worker counted the other's placements: together, every placement was seen by the
    # worker that did not make it.
    assert all(count > 0 for count in seen_by.values()), seen_by
    assert sum(seen_by.values()) == len(ids), (seen_by, by_worker)
