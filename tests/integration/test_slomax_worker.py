"""The streaming worker with ``slomax+tokenpilot``: admits, holds and rejects through the real
broker, and its control loop moves a share after reading goodput from the real ClickHouse engine."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from infra.clickhouse.client import connect
from schemas.events import AdmissionDecision, Completion, InferenceRequest
from schemas.topics import ADMISSION, COMPLETIONS, HEARTBEATS, REQUESTS
from tests.integration.streaming import Collector, heartbeat, publish, unique
from tests.integration.streaming import worker as worker_process


def ask(pool: str, request_id: str, input_tokens: int) -> InferenceRequest:
    return InferenceRequest(
        request_id=request_id,
        model=pool,
        input_tokens=input_tokens,
        output_budget=128,
        prompt_block_hashes=(),
    )


def ended(pool: str, request_id: str, ttft_s: float) -> Completion:
    now = time.time()
    return Completion(
        request_id=request_id, instance_id="i-1", model=pool, status="ok", arrival_ts=now - 5.0,
        ttft_s=ttft_s, tpot_s=0.02, e2e_s=5.0, input_tokens=1000, output_tokens=100, ts=now,
    )  # fmt: skip


def test_slomax_admits_holds_rejects_and_its_loop_reads_clickhouse(broker: str, tmp_path: Path) -> None:
    pool = unique("pool")
    store = f"chdb:///{tmp_path / 'clickhouse'}"
    params = {"slomax": {"control_interval_s": 1.0, "control_span_s": 120.0}}
    worker = worker_process(
        broker,
        unique("app"),
        tmp_path,
        clickhouse=store,
        settings={"TOKENFLEET_POLICY": "slomax+tokenpilot", "TOKENFLEET_POLICY_PARAMS": json.dumps(params)},
    )
    try:
        worker.wait_ready()

        async def scenario() -> list[bytes]:
            async with Collector(broker, ADMISSION, pool.encode()) as answers:
                await publish(broker, HEARTBEATS, [heartbeat(pool, "i-1")])
                await asyncio.sleep(1.0)
                # TokenPilot's prior on an idle H100 8B: ~0.05 s for 1 000 tokens (admit), ~1.5 s
                # for 30 000 (over the 1 s headroom of the 2 s objective, still feasible: held,
                # then expired), far beyond 15 s for 300 000 (long context: rejected at once).
                await publish(
                    broker,
                    REQUESTS,
                    [ask(pool, "small", 1_000), ask(pool, "middle", 30_000), ask(pool, "huge", 300_000)],
                )
                await answers.wait_for(3)
                # Interactive outcomes, most of them missing the objective: the loop must tighten.
                await publish(
                    broker,
                    COMPLETIONS,
                    [ended(pool, f"c{k}", 0.3 if k < 5 else 6.0) for k in range(20)],
                )
                for k in range(12):  # offers, so the admission stage (and its loop) runs
                    await publish(broker, HEARTBEATS, [heartbeat(pool, "i-1")])
                    await publish(broker, REQUESTS, [ask(pool, f"tick-{k}", 1_000)])
                    await asyncio.sleep(0.7)
                await answers.wait_for(20, timeout_s=20.0)
                return answers.values

        raw = asyncio.run(scenario())
        with urllib.request.urlopen(worker.metrics_url(), timeout=10) as response:
            samples = [s for f in text_string_to_metric_families(response.read().decode()) for s in f.samples]
    finally:
        worker.stop()  # the embedded store admits one process at a time
    answers = [AdmissionDecision.model_validate_json(v) for v in raw]
    by_id: dict[str, list[AdmissionDecision]] = {}
    for a in answers:
        by_id.setdefault(a.request_id, []).append(a)
    assert [a.action for a in by_id["small"]] == ["admit"], [a.reason for a in by_id["small"]]
    assert next((a.action, a.queue_pool) for a in by_id["middle"]) == ("queue", "interactive")
    assert by_id["middle"][-1].action == "reject" and by_id["middle"][-1].reason.startswith("expired")
    (huge,) = by_id["huge"]
    assert huge.action == "reject" and huge.reason.startswith("cannot_meet_slo")
    assert huge.retry_after_s is not None and huge.retry_after_s > 0
    with connect(store) as client:
        steps = client.query(
            "SELECT action, interactive_met_share, batch_share_before, batch_share_after "
            "FROM slomax_adjustments WHERE policy = 'slomax+tokenpilot' ORDER BY ts"
        ).result_rows
        rejects = client.query(
            "SELECT count() FROM admission_decisions FINAL WHERE action = 'reject' AND model = {p:String}",
            parameters={"p": pool},
        ).result_rows[0][0]
    assert rejects >= 2
    counted = {
        (s.labels["action"], s.labels["reason"]): s.value
        for s in samples
        if s.name == "tokenfleet_admissions_total" and s.labels["pool"] == pool
    }
    assert counted[("reject", "cannot_meet_slo")] == 1 and counted[("reject", "expired")] == 1
    assert counted[("admit", "")] >= 10 and counted[("queue", "")] >= 1
    knobs = {s.labels["knob"]: s.value for s in samples if s.name == "tokenfleet_slomax_knob"}
    assert knobs["batch_share"] < 0.3  # the share in force after the loop tightened
    tightened = [s for s in steps if s[0] == "tighten"]
    assert tightened, steps
    _action, met, before, after = tightened[0]
    assert met is not None and met < 0.5 and after < before
