"""The peer planners, one rule per test: the Kubernetes HPA (``hpa``) and Dynamo's SLA planner
(``dynamo-sla``), against hand-computed cases from their sources' formulas."""

from __future__ import annotations

import numpy as np
import pytest

from agents.policy.planners.contract import DcState, DemandSample, FleetState, ModelSpec, PoolState
from agents.policy.planners.dynamo_sla import (
    DynamoProfile,
    DynamoSlaParams,
    DynamoSlaPlanner,
    LoadPredictor,
)
from agents.policy.planners.hpa import HpaParams, HpaPlanner

MODEL = ModelSpec("m", "1", gpus=1, load_cold_s=60.0, load_warm_s=10.0)


def fleet(
    now_s: float,
    pools: tuple[PoolState, ...],
    demand: tuple[DemandSample, ...] = (),
    gpus: int = 64,
    model: ModelSpec = MODEL,
) -> FleetState:
    dcs = (DcState("A", "eu", "eu-1", gpus, 0), DcState("B", "us", "us-1", gpus, 0))
    return FleetState(now_s, (model,), dcs, pools, demand)


def pool(ready: int, waiting: int = 0, dc: str = "A", loading: int = 0) -> PoolState:
    return PoolState("m", "1", dc, ready, loading=loading, waiting=waiting)


def hpa_replicas(planner: HpaPlanner, state: FleetState, dc: str = "A") -> int:
    return planner.plan(state).replicas[("m", "1", dc)]


# --- hpa ----------------------------------------------------------------------------------------


def test_hpa_holds_inside_the_tolerance_band_and_scales_outside_it() -> None:
    # 4 replicas, target 5 waiting each: 21 waiting is a ratio of 1.05 (within 0.1), 23 is 1.15.
    assert hpa_replicas(HpaPlanner(), fleet(0.0, (pool(4, waiting=21),))) == 4
    assert hpa_replicas(HpaPlanner(), fleet(0.0, (pool(4, waiting=23),))) == 5  # ceil(23 / 5)


def test_hpa_metric_is_the_sum_over_ready_replicas_and_loading_ones_count_in_the_size() -> None:
    # 2 ready + 2 loading (the Deployment has 4): 30 waiting is a ratio of 30 / (5 x 4) = 1.5.
    assert hpa_replicas(HpaPlanner(), fleet(0.0, (pool(2, waiting=30, loading=2),))) == 6


def test_hpa_scale_down_waits_for_the_stabilisation_window() -> None:
    planner = HpaPlanner()
    assert hpa_replicas(planner, fleet(0.0, (pool(4, waiting=20),))) == 4
    for now in range(15, 300, 15):  # the queue is empty: every proposal is minReplicas
        assert hpa_replicas(planner, fleet(float(now), (pool(4),))) == 4, now
    # At 300 s the proposals of 4 made at 0 s leave the 300 s window: down to minReplicas at once
    # (the default scale-down policy allows 100 % per 15 s).
    assert hpa_replicas(planner, fleet(300.0, (pool(4),))) == 1


def test_hpa_scale_up_is_rate_limited_by_the_default_behaviour() -> None:
    planner = HpaPlanner()
    busy = 100  # ceil(100 / 5) = 20 wanted
    assert hpa_replicas(planner, fleet(0.0, (pool(1, waiting=busy),))) == 5  # max(1 + 4, 2 x 1)
    # Within the same 15 s period the replicas already added count against the limit.
    assert hpa_replicas(planner, fleet(5.0, (pool(1, waiting=busy, loading=4),))) == 5
    assert hpa_replicas(planner, fleet(15.0, (pool(5, waiting=busy),))) == 10  # max(5 + 4, 2 x 5)
    assert hpa_replicas(planner, fleet(30.0, (pool(10, waiting=busy),))) == 20


def test_hpa_max_is_the_dcs_gpu_budget_and_min_splits_the_model_floor() -> None:
    assert hpa_replicas(HpaPlanner(), fleet(0.0, (pool(4, waiting=500),), gpus=6)) == 6
    floor = ModelSpec("m", "1", gpus=1, load_cold_s=60.0, load_warm_s=10.0, min_replicas=3)
    state = fleet(0.0, (pool(1), pool(1, dc="B")), model=floor)
    plan = HpaPlanner().plan(state)
    assert plan.replicas == {("m", "1", "A"): 2, ("m", "1", "B"): 2}  # ceil(3 / 2) each


def test_hpa_plans_only_pools_seen_with_a_replica_and_is_deterministic() -> None:
    states = [fleet(15.0 * i, (pool(2, waiting=7 * i),)) for i in range(30)]
    first, second = HpaPlanner(), HpaPlanner()
    plans = [(first.plan(s).replicas, second.plan(s).replicas) for s in states]
    assert all(a == b for a, b in plans)
    assert all(set(a) == {("m", "1", "A")} for a, _ in plans)  # never B, which has no replica
    assert HpaPlanner().interval_s == 15.0 and HpaPlanner(HpaParams(sync_period_s=30)).interval_s == 30


# --- dynamo-sla ---------------------------------------------------------------------------------

PROFILE = DynamoProfile(
    ttft_s=2.0,
    itl_s=0.1,
    prefill_isl=(500.0, 4000.0),
    prefill_ttft_s=(0.05, 0.4),
    prefill_tokens_per_s=(10_000.0, 10_000.0),
    decode_context=(500.0, 5000.0),
    decode_itl_s=(0.05, 0.05),
    decode_concurrency=(100, 100),
    decode_tokens_per_s=(2000.0, 2000.0),
)


def demand(rate: float, isl: int, osl: int, home: str = "A", start: float = 0.0) -> DemandSample:
    n = int(rate * 180)
    return DemandSample(
        "m",
        "1",
        home,
        start,
        start + 180.0,
        arrivals=n,
        input_tokens=n * isl,
        completed=n,
        output_tokens=n * osl,
    )


def dynamo_plan(planner: DynamoSlaPlanner, state: FleetState) -> dict[tuple[str, str, str], int]:
    return dict(planner.plan(state).replicas)


def test_dynamo_replicas_are_the_sum_of_prefill_and_decode_needs() -> None:
    # 10 req/s of 1000 prompt tokens: 10 x 1000 / 10 000 = 1.0 replica of prefill;
    # 250 output tokens: 10 x 250 / 2000 = 1.25 of decode; ceil(2.25) = 3 aggregated replicas.
    planner = DynamoSlaPlanner({("m", "1"): PROFILE})
    plan = planner.plan(fleet(180.0, (pool(1),), (demand(10, 1000, 250),)))
    assert plan.replicas == {("m", "1", "A"): 3}
    assert "ceil(sum) 3" in plan.reasons[("m", "1", "A")]
    assert PROFILE.engine_rps(1000, 250) == pytest.approx(1 / (1000 / 10_000 + 250 / 2000))


def test_dynamo_keeps_min_endpoint_and_the_dcs_budget() -> None:
    planner = DynamoSlaPlanner({("m", "1"): PROFILE})
    assert dynamo_plan(planner, fleet(180.0, (pool(2),), (demand(0.5, 1000, 250),))) == {("m", "1", "A"): 1}
    planner = DynamoSlaPlanner({("m", "1"): PROFILE})
    assert dynamo_plan(planner, fleet(180.0, (pool(2),), (demand(40, 1000, 250),), gpus=4)) == {
        ("m", "1", "A"): 4
    }


def test_dynamo_maps_demand_by_home_dc_and_shares_a_dc_without_a_pool() -> None:
    planner = DynamoSlaPlanner({("m", "1"): PROFILE})
    pools = (pool(1), pool(3, dc="B"))
    # 10 req/s whose home is C (no pool there): A gets 1/4, B 3/4 (by replicas); B's own 10 too.
    state = fleet(180.0, pools, (demand(10, 1000, 250, home="C"), demand(10, 1000, 250, home="B")))
    replicas = dynamo_plan(planner, state)
    assert replicas == {("m", "1", "A"): 1, ("m", "1", "B"): 4}  # ceil(0.5625), ceil(2.25 x 1.75)


def test_dynamo_holds_until_it_has_seen_requests_and_their_lengths() -> None:
    planner = DynamoSlaPlanner({("m", "1"): PROFILE})
    plan = planner.plan(fleet(180.0, (pool(2),)))
    assert plan.replicas == {}
    assert "no request observed" in plan.reasons[("m", "1", "A")]
    assert planner.interval_s == 180.0
    assert DynamoSlaPlanner({}, DynamoSlaParams(adjustment_interval_s=60)).interval_s == 60


def test_dynamo_follows_the_predicted_rate_once_it_has_enough_points() -> None:
    planner = DynamoSlaPlanner({("m", "1"): PROFILE}, DynamoSlaParams(predictor="constant"))
    for i, rate in enumerate((2, 4, 10)):
        now = 180.0 * (i + 1)
        replicas = dynamo_plan(planner, fleet(now, (pool(1),), (demand(rate, 1000, 250, start=now - 180),)))
    assert replicas == {("m", "1", "A"): 3}  # the constant predictor: the last interval's rate


# --- the load predictor -------------------------------------------------------------------------


def test_predictor_before_five_points_constant_history_and_leading_zeros() -> None:
    predictor = LoadPredictor()
    for value in (0.0, 0.0, 3.0, 7.0):
        predictor.add(value)
    assert predictor.values == [3.0, 7.0]  # the idle start is not load
    assert predictor.predict() == 7.0  # fewer than five points: the last value
    flat = LoadPredictor()
    for _ in range(8):
        flat.add(4.0)
    assert flat.predict() == 4.0
    nan = LoadPredictor()
    nan.add(5.0)
    nan.add(float("nan"))
    assert nan.values == [5.0, 0.0]


def test_arima_forecasts_an_autoregressive_series_near_its_conditional_mean() -> None:
    rng = np.random.default_rng(1)
    values = [20.0]
    for _ in range(80):
        values.append(10 + 0.5 * values[-1] + rng.normal(0, 1))
    predictor = LoadPredictor()
    for value in values:
        predictor.add(value)
    forecast = predictor.predict()
    assert predictor.order is not None and predictor.order[1] == 0  # stationary: not differenced
    assert forecast == pytest.approx(10 + 0.5 * values[-1], abs=1.0)
    again = LoadPredictor()
    for value in values:
        again.add(value)
    assert again.predict() == forecast  # deterministic


def test_arima_differences_a_trend_and_never_forecasts_below_zero() -> None:
    rng = np.random.default_rng(0)
    trend = list(100 + 5 * np.arange(60) + rng.normal(0, 3, 60))
    predictor = LoadPredictor()
    for value in trend:
        predictor.add(value)
    forecast = predictor.predict()
    assert predictor.order is not None and predictor.order[1] >= 1  # KPSS: not level-stationary
    assert forecast == pytest.approx(trend[-1] + 5, abs=6)
    falling = LoadPredictor()
    for value in (50.0, 40.0, 30.0, 20.0, 10.0, 1.0):
        falling.add(value)
    assert falling.predict() >= 0.0


def test_profile_rejects_a_grid_out_of_order() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        DynamoProfile(2.0, 0.1, (2.0, 1.0), (0.1, 0.1), (1.0, 1.0), (1.0,), (0.1,), (1,), (1.0,))


def test_dynamo_does_not_count_an_interval_of_no_length() -> None:
    planner = DynamoSlaPlanner({("m", "1"): PROFILE})
    start = DemandSample("m", "1", "A", 0.0, 0.0, arrivals=1, input_tokens=1000)
    planner.plan(fleet(0.0, (pool(1),), (start,)))  # the plan at the start of a run
    replicas = dynamo_plan(planner, fleet(180.0, (pool(1),), (demand(10, 1000, 250),)))
    assert replicas == {("m", "1", "A"): 3}
    assert planner._pools[("m", "1", "A")].rate.values == [10.0]  # one point: the interval of 180 s
