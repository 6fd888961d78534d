"""What a compliant token cost: busy time shared by tokens, idle apart, waste, prices."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from sim.engine.fleet import fleet_from_doc
from sim.evaluation.cost import costs
from sim.evaluation.metrics import judged
from sim.loop.config import SimConfig
from sim.loop.runner import simulate
from tests.unit.sim.helpers import fleet_of, request, workload

SLO = dict(DEFAULT_SLO_CLASSES)


def test_a_request_alone_pays_for_every_busy_second_and_idle_is_apart() -> None:
    # "late" arrives at 100 s only to close the window [0, 100] s; it runs after the window.
    run = simulate(
        workload(request("a", 0.0, 1000, 100), request("late", 100.0, 10, 1)),
        fleet_of(1),
        "round-robin",
        SimConfig(),
    )
    a = next(x for x in run.attempts if x.request.request_id == "a")
    assert a.busy_s > 0 and a.busy_s == pytest.approx(run.busy_s[0], rel=1e-9)  # nothing unattributed
    spend = costs(
        run.attempts, judged(run.attempts, run.window, SLO), fleet_of(1).instances, run.busy_s, [100.0]
    )
    total = spend["total"]
    assert isinstance(total, dict)
    assert total["gpu_seconds_busy"] == pytest.approx(run.busy_s[0], abs=1e-6)
    assert total["gpu_seconds_idle"] == pytest.approx(100.0 - run.busy_s[0], abs=1e-6)
    assert total["cost"] == pytest.approx(100.0 * 3.0 / 3600, abs=1e-6)  # the whole window at $3 an hour
    # 100 compliant tokens: a met its objective
    assert total["cost_per_million_goodput_tokens"] == pytest.approx(100.0 * 3.0 / 3600 / 100 * 1e6, abs=1e-6)
    assert total["wasted_gpu_seconds"] == 0.0


def test_a_prompt_pays_for_the_steps_its_chunks_fill() -> None:
    # a long prompt and a short one together: the long one computes more tokens, so pays more
    run = simulate(
        workload(
            request("long", 0.0, 6000, 10), request("short", 0.0, 100, 10), request("late", 60.0, 10, 1)
        ),
        fleet_of(1),
        "round-robin",
        SimConfig(),
    )
    long, short = (next(x for x in run.attempts if x.request.request_id == rid) for rid in ("long", "short"))
    assert long.busy_s > 3 * short.busy_s  # its 6 000-token chunk against 100 in the shared step
    assert long.busy_s + short.busy_s == pytest.approx(run.busy_s[0], rel=1e-9)


def test_work_that_missed_its_objective_is_wasted() -> None:
    # a batch request whose deadline has passed before it can finish: all its compute is waste
    late = request("batch", 0.0, 2000, 400, deadline_s=0.5, task_type="batch", slo_class="batch")
    run = simulate(workload(late, request("end", 30.0, 10, 1)), fleet_of(1), "round-robin", SimConfig())
    spend = costs(
        run.attempts, judged(run.attempts, run.window, SLO), fleet_of(1).instances, run.busy_s, [30.0]
    )
    per_class = spend["per_class"]
    assert isinstance(per_class, dict)
    attempt = next(x for x in run.attempts if x.request.request_id == "batch")
    assert per_class["batch"]["wasted_gpu_seconds"] == pytest.approx(attempt.busy_s) and attempt.busy_s > 0
    assert per_class["batch"]["cost_per_million_goodput_tokens"] is None  # no goodput


def test_prices_come_from_the_fleet_file_and_null_means_gpu_hours_only() -> None:
    doc = {
        "data_centres": [
            {"name": "A", "price_per_hour": 2.0, "instances": [
                {"count": 1, "profile": "llama3-8b-h100"},
                {"count": 1, "profile": "llama3-8b-h100", "price_per_hour": 1.0},
            ]},
            {"name": "B", "instances": [{"count": 1, "profile": "llama3-70b-tp4-h100"}]},
            {"name": "C", "price_per_hour": None, "instances": [{"count": 1, "profile": "llama3-8b-h100"}]},
        ]
    }  # fmt: skip
    fleet = fleet_from_doc(doc, Path("fleet.yaml"))
    assert [spec.price for spec in fleet.instances] == [2.0, 1.0, 12.0, None]
    assert fleet.instances[2].profile.gpus == 4
    run = simulate(
        workload(request("a", 0.0, 500, 20), request("b", 10.0, 10, 1)),
        replace(fleet, instances=fleet.instances[3:]),
        "round-robin",
        SimConfig(),
    )
    spend = costs(
        run.attempts, judged(run.attempts, run.window, SLO), fleet.instances[3:], run.busy_s, [10.0]
    )
    total = spend["total"]
    assert isinstance(total, dict)
    assert total["cost"] is None and total["gpu_seconds_busy"] == pytest.approx(run.busy_s[0], abs=1e-6)
    with pytest.raises(ValueError, match="price_per_hour must be a number >= 0 or null"):
        fleet_from_doc({"data_centres": [{"name": "A", "price_per_hour": -1}]}, Path("bad.yaml"))
