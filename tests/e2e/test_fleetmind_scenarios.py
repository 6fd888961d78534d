"""FleetMind's judged claims on the shipped scenarios, at full size (one run each, seed 0):
the hot spot's goodput, diverted requests within their objective, no rule broken, and the DC
failure left within two heartbeat intervals and returned to gradually."""

from __future__ import annotations

from typing import Any

from sim.evaluation.scenario import run_scenario
from sim.loop.config import SimConfig
from sim.scenarios import load_scenario


def test_the_hotspot_gains_goodput_by_diverting_within_the_objective_and_the_rules() -> None:
    document = run_scenario(load_scenario("hotspot"), ["fleetmind+tokenpilot", "local-only"], SimConfig())
    results: Any = document["results"]
    fleetmind, local = results["fleetmind+tokenpilot"], results["local-only"]
    assert fleetmind["hotspot"]["goodput_tokens_per_s"] >= 1.3 * local["hotspot"]["goodput_tokens_per_s"]
    assert fleetmind["violations"]["total"] == 0
    diverted = fleetmind["diverted"]
    assert diverted["requests"] > 100 and diverted["by_dc"].get("B", 0) < diverted["requests"] / 10
    for name, cls in diverted["per_class"].items():
        assert cls["ttft_p95_s"] is not None and cls["ttft_p95_s"] <= cls["ttft_objective_s"], name


def test_a_failed_dc_gets_nothing_after_two_heartbeats_and_its_traffic_returns() -> None:
    config = SimConfig()
    document = run_scenario(load_scenario("dc-failure"), ["fleetmind+tokenpilot"], config)
    result: Any = document["results"]["fleetmind+tokenpilot"]  # type: ignore[index]
    (outage,) = result["outages"]
    assert outage["sent_after_detection"] == 0
    assert outage["last_sent_after_down_s"] <= 2 * config.heartbeat_s
    assert outage["goodput_recovered_after_s"] is not None and outage["goodput_recovered_after_s"] <= 30
    assert outage["dc_share_recovered_after_s"] is not None and outage["dc_share_recovered_after_s"] <= 30
    assert result["violations"]["total"] == 0
    assert result["notices"]["by_kind"]["dc_down"] == 1 and result["notices"]["by_kind"]["dc_up"] == 1
