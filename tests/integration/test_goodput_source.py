"""SLOMax's control loop reads the same inputs from ClickHouse as from memory, on the same events."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import pytest
from clickhouse_connect.driver.client import Client

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from agents.policy.slomax.controller import Controller, Knobs
from agents.policy.slomax.feedback import ClassWindow, InMemoryGoodput
from infra.clickhouse import FeedbackSink, connect, migrate
from infra.clickhouse.goodput import ClickHouseGoodput, ClickHouseOutcomes
from infra.clickhouse.sink import met_slo
from schemas.events import AdmissionDecision, Completion
from sim.engine.fleet import parse_fleet
from sim.loop.config import SimConfig
from sim.loop.runner import simulate
from sim.workloads.sources import open_workload

T0 = 1_700_000_000.0


def events() -> tuple[list[Completion], list[AdmissionDecision]]:
    """Ended attempts of every kind over 100 s: met, slow first token, slow tokens, timeouts,
    aborts, retries, a batch deadline missed; and some rejects."""
    completions = []
    for k in range(60):
        cls = ("interactive", "long_context", "batch")[k % 3]
        status: Literal["ok", "timeout", "aborted"] = ("ok", "ok", "ok", "timeout", "aborted")[k % 5]
        ttft = (0.4, 2.5, 0.3, 30.0)[k % 4] if status == "ok" else None
        completions.append(
            Completion(
                request_id=f"r{k}",
                attempt=1 + (k % 7 == 0),
                instance_id="i0",
                model="m",
                slo_class=cls,
                status=status,
                ts=T0 + 1.5 * k + 0.25,
                arrival_ts=T0 + 1.5 * k - 5.0,
                ttft_s=ttft,
                tpot_s=0.02 if k % 6 else 0.5,
                e2e_s=5.0,
                input_tokens=500,
                output_tokens=10 + k,
                deadline_ts=T0 + 1.5 * k - 5.0 + (3.0 if k % 4 else 600.0) if cls == "batch" else None,
            )
        )
    rejects = [
        AdmissionDecision(
            request_id=f"x{k}",
            model="m",
            slo_class=("interactive", "batch")[k % 2],
            action="reject",
            reason="cannot_meet_slo: test",
            policy="slomax+tokenpilot",
            ts=T0 + 7.0 * k + 0.5,
        )
        for k in range(12)
    ]
    return completions, rejects


def test_clickhouse_and_memory_give_the_controller_the_same_windows_and_steps(client: Client) -> None:
    completions, rejects = events()
    sink = FeedbackSink(client, DEFAULT_SLO_CLASSES, retry_for_s=5.0)
    sink.write_completions(completions)
    sink.write_completions(completions[:10])  # a redelivery: stored once
    sink.write_admission(rejects)
    memory = InMemoryGoodput()
    for c in completions:
        met = met_slo(c, DEFAULT_SLO_CLASSES[c.slo_class])
        memory.completed(c.ts, c.slo_class, c.status, met, c.output_tokens, c.attempt)
    for r in rejects:
        memory.rejected(r.ts, r.slo_class)
    stored = ClickHouseGoodput(client)

    for now, span in ((T0 + 30.0, 30.0), (T0 + 60.0, 60.0), (T0 + 95.0, 20.0), (T0 + 200.0, 60.0)):
        assert stored.window(now, span) == memory.window(now, span), (now, span)
    assert stored.window(T0 + 90.0, 90.0)["interactive"].finished > 0  # not vacuous

    steps = []
    for source in (memory, stored):
        controller = Controller(knobs=Knobs(0.5, 0.3), default=Knobs(0.5, 0.3), target=0.99)
        steps.append([controller.update(source.window(T0 + t, 60.0), T0 + t) for t in range(10, 120, 10)])
    assert steps[0] == steps[1]
    assert {s.action for s in steps[0]} >= {"tighten"}


def test_control_steps_are_written_with_what_they_read(client: Client) -> None:
    source = ClickHouseGoodput(client, policy="slomax+tokenpilot")
    controller = Controller()
    step = controller.update({}, T0)
    source.record(step)
    rows = client.query(
        "SELECT policy, action, reason, headroom_before, headroom_after FROM slomax_adjustments"
    ).result_rows
    assert rows == [("slomax+tokenpilot", "stale", step.reason, 0.65, 0.65)]


def test_a_simulated_run_closes_its_loop_through_clickhouse_exactly_as_through_memory(tmp_path: Path) -> None:
    """The same seeded run with its outcomes in memory and in the embedded ClickHouse: the
    controller takes the same steps, so every decision is the same."""
    workload = open_workload("synthetic:rate_per_s=12,duration_s=120,batch_jobs_per_hour=60")
    fleet = parse_fleet("2xllama3-8b-h100")
    params = {"slomax": {"control_interval_s": 5.0, "control_span_s": 20.0}}
    memory = simulate(workload, fleet, "slomax+tokenpilot", SimConfig(), params=params)
    with connect(f"chdb:///{tmp_path / 'sim-clickhouse'}") as client:
        migrate(client)
        outcomes = ClickHouseOutcomes(client, DEFAULT_SLO_CLASSES, policy="slomax+tokenpilot")
        stored = simulate(workload, fleet, "slomax+tokenpilot", SimConfig(), params=params, feedback=outcomes)
        outcomes.flush()
        rows = client.query("SELECT count() FROM completions FINAL").result_rows[0][0]
    assert rows == sum(1 for a in stored.attempts if a.instance is not None and a.end_s is not None)
    decided = [(a.request.request_id, a.attempt, a.status, a.first_token_s) for a in memory.attempts]
    assert decided == [(a.request.request_id, a.attempt, a.status, a.first_token_s) for a in stored.attempts]
    assert {a.status for a in memory.attempts} >= {"ok", "rejected"}  # the loop had work to do


def test_slomax_status_prints_the_configuration_and_the_last_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    url = f"chdb:///{tmp_path / 'clickhouse'}"
    now = time.time()
    with connect(url) as opened:
        migrate(opened)
        source = ClickHouseGoodput(opened, policy="slomax+tokenpilot")
        controller = Controller()
        source.record(controller.update({}, now - 20))
        met = {"interactive": ClassWindow("interactive", finished=100, met=90, newest_s=now - 10)}
        source.record(controller.update(met, now - 10))
        FeedbackSink(opened, DEFAULT_SLO_CLASSES).write_admission(
            [
                AdmissionDecision(
                    request_id="z", model="m", slo_class="interactive", action="reject",
                    reason="cannot_meet_slo: late", policy="slomax+tokenpilot", ts=now - 5,
                )
            ]
        )  # fmt: skip
    monkeypatch.setenv("TOKENFLEET_CLICKHOUSE_DSN", url)
    monkeypatch.setenv("TOKENFLEET_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TOKENFLEET_POLICY", "slomax+tokenpilot")
    monkeypatch.setenv(
        "TOKENFLEET_POLICY_PARAMS", '{"slomax": {"batch_share": 0.3, "tenant_tiers": {"gold": 0}}}'
    )
    assert main(["slomax", "status"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "policy slomax+tokenpilot (admission: slomax)"
    assert "batch_share=0.3" in out[1] and out[2] == "tenant_tiers: {'gold': 0}"
    assert out[3].startswith("in force (slomax+tokenpilot, since") and out[3].endswith(
        "headroom 0.550, batch_share 0.240"
    )
    assert "tighten" in out[5] and "stale" in out[6]
    assert out[-1].endswith("interactive/cannot_meet_slo 1")
