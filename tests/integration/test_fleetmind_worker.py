"""The streaming worker with ``fleetmind+least-tokens`` on the real broker and the real ClickHouse
engine: when a data centre's heartbeats stop, requests for it go to the other DC within two
heartbeat intervals, and the ``dc_down`` FleetMind noticed is on ``tf.fleet-events``, in the
Prometheus counter and in the ``fleet_events`` table."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from infra.clickhouse.client import connect
from schemas.codec import encode
from schemas.events import AdmissionDecision, FleetEvent, InferenceRequest, RoutingDecision
from schemas.topics import ADMISSION, DECISIONS, FLEET_EVENTS, HEARTBEATS, REQUESTS, key_of
from tests.integration.streaming import Collector, heartbeat, publish, unique
from tests.integration.streaming import worker as worker_process

HEARTBEAT_S = 0.5  # the fleet's interval: an instance silent for 1 s is out of capacity
RULES = """\
data_centres:
  - {name: dc-a, region: eu}
  - {name: dc-b, region: us}
tenants:
  resident: {regions: [eu]}
"""


def ask(pool: str, request_id: str, tenant: str = "default") -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id, tenant=tenant, model=pool, input_tokens=1000, output_budget=128, home_dc="dc-a"
    )


class Beats:
    """Heartbeats of ``instances`` (instance id -> DC) every ``period_s`` until stopped; ``stop``
    one instance's and learn the ``ts`` of its last heartbeat sent."""

    def __init__(self, bootstrap: str, pool: str, instances: dict[str, str], period_s: float) -> None:
        self.bootstrap, self.pool, self.period_s = bootstrap, pool, period_s
        self.instances = dict(instances)
        self.last_ts: dict[str, float] = {}
        self.rounds = 0
        self._done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Beats:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._done.set()
        if self._task is not None:
            await self._task

    async def stop(self, instance: str) -> float:
        """Stop ``instance``'s heartbeats; the ``ts`` of the last one sent."""
        del self.instances[instance]
        rounds = self.rounds
        while self.rounds < rounds + 1:  # the round in progress may still have sent one
            await asyncio.sleep(0.02)
        return self.last_ts[instance]

    async def _run(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap)
        await producer.start()
        try:
            while not self._done.is_set():
                for instance, dc in list(self.instances.items()):
                    beat = heartbeat(self.pool, instance, dc=dc)
                    await producer.send_and_wait(HEARTBEATS.name, encode(beat), key=key_of(HEARTBEATS, beat))
                    self.last_ts[instance] = beat.ts
                self.rounds += 1
                await asyncio.sleep(self.period_s)
        finally:
            await producer.stop()


def test_a_dc_whose_heartbeats_stop_loses_its_traffic_and_is_reported_down(
    broker: str, tmp_path: Path
) -> None:
    pool = unique("pool")
    rules = tmp_path / "fleet.yaml"
    rules.write_text(RULES)
    store = f"chdb:///{tmp_path / 'clickhouse'}"
    worker = worker_process(
        broker,
        unique("app"),
        tmp_path,
        clickhouse=store,
        settings={
            "TOKENFLEET_POLICY": "fleetmind+least-tokens",
            "TOKENFLEET_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
            "TOKENFLEET_FLEET_RULES": str(rules),
            "TOKENFLEET_DC_RTT_MS": json.dumps({"dc-a": 2.0, "dc-b": 40.0}),
        },
    )
    try:
        worker.wait_ready()

        async def scenario() -> tuple[list[bytes], list[bytes], list[bytes], float]:
            key = pool.encode()
            async with (
                Collector(broker, DECISIONS, key) as routed,
                Collector(broker, ADMISSION, key) as admitted,
                Collector(broker, FLEET_EVENTS, key) as noticed,
                Beats(broker, pool, {"a-1": "dc-a", "b-1": "dc-b"}, HEARTBEAT_S / 2) as beats,
            ):
                await asyncio.sleep(1.0)  # both instances in the worker's table
                await publish(broker, REQUESTS, [ask(pool, f"before-{k}") for k in range(3)])
                await routed.wait_for(3)
                last_a = await beats.stop("a-1")
                # two intervals after dc-a's last heartbeat (and a margin): dc-a is out of capacity
                await asyncio.sleep(max(last_a + 2 * HEARTBEAT_S + 0.2 - time.time(), 0.0))
                after = [ask(pool, f"after-{k}") for k in range(3)]
                await publish(broker, REQUESTS, [*after, ask(pool, "resident", tenant="resident")])
                await routed.wait_for(6)
                await admitted.wait_for(7)
                await noticed.wait_for(1)
                await asyncio.sleep(1.0)  # anything extra would show up now
                return routed.values, admitted.values, noticed.values, last_a

        routed_raw, admitted_raw, noticed_raw, last_a = asyncio.run(scenario())
        with urllib.request.urlopen(worker.metrics_url(), timeout=10) as response:
            samples = [s for f in text_string_to_metric_families(response.read().decode()) for s in f.samples]
    finally:
        worker.stop()  # the embedded store admits one process at a time; stopping flushes it

    placed = {d.request_id: d.dc for d in map(RoutingDecision.model_validate_json, routed_raw)}
    assert placed == {
        "before-0": "dc-a", "before-1": "dc-a", "before-2": "dc-a",
        "after-0": "dc-b", "after-1": "dc-b", "after-2": "dc-b",
    }  # fmt: skip
    # The rules file reached FleetMind: a tenant resident in dc-a's region waits for dc-a.
    answers = [AdmissionDecision.model_validate_json(v) for v in admitted_raw]
    resident = [(a.action, a.queue_pool) for a in answers if a.request_id == "resident"]
    assert resident == [("queue", "no_capacity")]

    (down,) = [FleetEvent.model_validate_json(v) for v in noticed_raw]
    assert (down.kind, down.dc, down.model) == ("dc_down", "dc-a", pool)
    assert down.ts > last_a + 2 * HEARTBEAT_S and down.worker
    counted = {
        (s.labels["kind"], s.labels["dc"]): s.value
        for s in samples
        if s.name == "tokenfleet_fleet_events_total"
    }
    assert counted == {("dc_down", "dc-a"): 1}

    with connect(store) as client:
        rows = client.query(
            "SELECT event_id, kind, dc, model_version, detail, run_policy FROM fleet_events FINAL "
            "WHERE model = {p:String}",
            parameters={"p": pool},
        ).result_rows
    assert [tuple(r) for r in rows] == [
        (down.event_id, "dc_down", "dc-a", "", down.detail, "fleetmind+least-tokens")
    ]
