"""``python -m bench.slomax``: one run's figures, cost per compliant token included."""

from __future__ import annotations

from bench.slomax import fairness, run, table
from sim.engine.fleet import parse_fleet
from sim.loop.config import SimConfig
from sim.workloads.sources import open_workload


def test_one_run_reports_goodput_and_what_a_compliant_token_cost() -> None:
    workload = open_workload("synthetic:duration_s=30,rate_per_s=4", seed=1)
    figures = {
        policy: run(workload, parse_fleet("2xllama3-8b-h100"), policy, SimConfig(seed=1))
        for policy in ("tokenpilot", "slomax+tokenpilot")
    }
    for f in figures.values():
        assert f["goodput_tokens_per_s"] > 0
        # the fleet is priced (2 instances at $3 an hour): every policy has a cost per compliant token
        assert f["cost_per_million_goodput_tokens"] > 0 and f["wasted_gpu_seconds"] >= 0
    printed = table("light load", figures)
    assert "$/M good" in printed and "slomax+tokenpilot vs FCFS: goodput" in printed


def test_fairness_reports_goodput_and_met_output_kept_by_the_light_tenant() -> None:
    workload = open_workload("synthetic:duration_s=30,rate_per_s=4,tenants=3", seed=1)
    fair = fairness(workload, parse_fleet("2xllama3-8b-h100"), SimConfig(seed=1), 1.0)
    assert fair["light_requests"] > 0 and fair["heavy_requests"] > 0
    for policy in ("tokenpilot", "slomax+tokenpilot"):
        f = fair[policy]
        # met output counts every met request of the window, goodput only those ended inside it
        assert f["light_met_output_alone"] >= f["light_goodput_alone"] > 0
        assert f["light_met_output_with_heavy"] >= f["light_goodput_with_heavy"] > 0
        assert f["kept"] > 0 and f["kept_met"] > 0
    # a 30 s window: some of the light tenant's met requests are still decoding when it closes
    alone = fair["slomax+tokenpilot"]
    assert alone["light_met_output_alone"] > alone["light_goodput_alone"]
