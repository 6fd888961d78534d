"""FleetMind's prefill : decode ratio, rule by rule: a split where prefill slows the decodes of a
``both`` replica past a tight TPOT, none where the decode side is bound by its KV cache or the
prompts are short at the default objective, the rates as the formulas give them."""

from __future__ import annotations

import math

import pytest

from agents.policy.fleetmind.planner import FleetMindPlanner, PlannerParams
from agents.policy.fleetmind.split import StepLaw, Work, link_carries, split
from agents.policy.planners import build_planner
from agents.policy.planners.contract import DcState, DemandSample, FleetState, ModelSpec

pytestmark = pytest.mark.unit

LAW = StepLaw(t0_s=0.01, per_request_s=4e-5, per_context_s=8e-8, per_token_s=3e-5, per_pair_s=1.5e-9)
KV = 400_000
SPLITTING = PlannerParams(split_gain=0.1)  # FleetMind splits only when asked


def rag(prompt: float = 4000, output: float = 100) -> Work:
    return Work(input_tokens=prompt, cached_share=0.0, output_tokens=output, kv_tokens=prompt + output)


def decide(work: Work, tpot_s: float):  # type: ignore[no-untyped-def]
    return split(LAW, work, tpot_s, 2.0, KV, headroom=0.7, kv_share=0.85)


def test_the_rates_are_the_formulas() -> None:
    work = rag()
    found = decide(work, 0.04)
    context = 4000 + 100 / 2
    per = 4e-5 + 8e-8 * context
    batch = (0.7 * 0.04 - 0.01) / per
    assert found.mu_decode == pytest.approx(batch / (0.01 + batch * per) / 100)
    p = 3e-5 * 4000 + 1.5e-9 * 4000 * 2000
    wait = 0.7 * 2.0 - p
    assert found.mu_prefill == pytest.approx((2 * wait / (p + 2 * wait)) / p)
    # mu_b is the fixed point: (1 - phi) r(h tau (1 - phi)) / O at phi = mu_b p
    phi = found.mu_both * p
    tight = (0.7 * 0.04 * (1 - phi) - 0.01) / per
    assert found.mu_both == pytest.approx((1 - phi) * tight / (0.01 + tight * per) / 100, rel=1e-6)
    per_request = 1 / found.mu_prefill + 1 / found.mu_decode
    assert found.ratio == pytest.approx(found.mu_both * per_request)
    assert found.prefill_share == pytest.approx((1 / found.mu_prefill) / per_request)


def test_prefill_heavy_work_at_a_tight_tpot_splits() -> None:
    found = decide(rag(), 0.04)
    assert found.ratio <= 0.9 and 0.5 < found.prefill_share < 0.9


def test_no_split_at_the_default_objective_or_where_the_kv_cache_bounds_the_decodes() -> None:
    gain = SPLITTING.split_gain or 0.0
    assert decide(rag(), 0.1).ratio > 1 - gain  # a both replica's decodes nearly keep 0.1 s
    long_context = Work(input_tokens=20_000, cached_share=0.3, output_tokens=300, kv_tokens=20_300)
    assert decide(long_context, 0.04).ratio > 1 - gain  # KV-bound: no faster decode without prefill


def test_no_split_when_a_prompt_alone_misses_the_ttft_objective() -> None:
    found = split(LAW, rag(prompt=60_000), 0.04, 2.0, KV, 0.7, 0.85)
    assert found.mu_prefill == 0 and found.ratio == float("inf")


def test_the_link_must_carry_the_uncached_prompts() -> None:
    work = rag()
    bytes_per_s = 10 * 4000 * 131072 * 8  # 10 requests/s of 4000 new tokens, 128 KiB each
    assert link_carries(10, work, 131072, gbps=bytes_per_s / 1e9 / 0.8, share=0.8)
    assert not link_carries(10, work, 131072, gbps=bytes_per_s / 1e9 / 0.8 * 0.99, share=0.8)


MODEL = ModelSpec("llama", "1", 1, 120.0, 20.0, min_replicas=1, kv_tokens=KV, kv_bytes_per_token=131072)


def plan_for(link_gbps: float, tpot_s: float, planner: FleetMindPlanner | None = None):  # type: ignore[no-untyped-def]
    n = 600  # 20 requests/s over 30 s of 4000-token prompts, 100 tokens out
    sample = DemandSample(
        "llama", "1", "A", 0.0, 30.0, arrivals=n, input_tokens=n * 4000, output_budget=n * 200,
        completed=n, met_slo=n, output_tokens=n * 100, completed_input_tokens=n * 4000,
        met_input_tokens=n * 4000,
    )  # fmt: skip
    dc = DcState("A", "eu", "eu-1", 64, 0, kv_link_gbps=link_gbps)
    planner = planner or FleetMindPlanner(params=SPLITTING)
    return planner.plan(FleetState(30.0, (MODEL,), (dc,), (), (sample,), 2.0, tpot_s)), planner


def test_fleetmind_runs_prefill_replicas_where_the_split_pays_and_the_dc_has_a_link() -> None:
    key = ("llama", "1", "A")
    split_plan, planner = plan_for(400.0, 0.04)
    whole_plan, _ = plan_for(0.0, 0.04)
    found = planner.split_for(MODEL, FleetState(30.0, (MODEL,), (), (), (), 2.0, 0.04))
    assert found.prefill_share > 0
    replicas = split_plan.replicas[key]
    assert split_plan.prefill[key] == min(max(round(found.prefill_share * replicas), 1), replicas - 1)
    assert replicas <= math.ceil(whole_plan.replicas[key] * found.ratio) + 1  # the need, scaled
    assert "prefill only" in split_plan.reasons[key]
    assert whole_plan.prefill[key] == 0  # no link: no prefill replica
    assert plan_for(400.0, 0.1)[0].prefill[key] == 0  # the default objective: all both


def test_a_pool_that_splits_keeps_splitting_down_to_half_the_gain() -> None:
    key = ("llama", "1", "A")
    ratio = plan_for(400.0, 0.04)[1].split_for(MODEL, FleetState(30.0, (MODEL,), (), (), (), 2.0, 0.04)).ratio
    between = PlannerParams(split_gain=1.5 * (1 - ratio))  # 1 - gain < ratio <= 1 - gain / 2
    fresh = FleetMindPlanner(params=between)
    assert plan_for(400.0, 0.04, fresh)[0].prefill[key] == 0
    splitting = FleetMindPlanner(params=PlannerParams(split_gain=0.5 * (1 - ratio)))
    assert plan_for(400.0, 0.04, splitting)[0].prefill[key] > 0
    splitting.params = between  # the same pool, now at a ratio between the two thresholds
    assert plan_for(400.0, 0.04, splitting)[0].prefill[key] > 0


def test_fleetmind_splits_only_when_asked() -> None:
    key = ("llama", "1", "A")
    assert plan_for(400.0, 0.04, FleetMindPlanner())[0].prefill[key] == 0
    assert plan_for(400.0, 0.04)[0].prefill[key] > 0


def test_split_gain_is_set_as_a_planner_parameter() -> None:
    planner = build_planner("fleetmind", params={"split_gain": "0.1"})
    assert isinstance(planner, FleetMindPlanner) and planner.params.split_gain == 0.1
    with pytest.raises(ValueError, match="split_gain: 'x' is not a number"):
        build_planner("fleetmind", params={"split_gain": "x"})
