"""SLO capacity: the bisection (monotone share, within the precision) and the JSON contract."""

from __future__ import annotations

import math

import pytest

from sim.evaluation.capacity import MAX_SCALE, MIN_SCALE, Probe, bisect_capacity, capacities
from sim.loop.config import SimConfig
from sim.workloads.sources import open_workload
from tests.unit.sim.helpers import fleet_of


def monotone(true_capacity: float) -> tuple[list[float], object]:
    """A share that falls with load and crosses 99 % exactly at ``true_capacity``."""
    seen: list[float] = []

    def measure(scale: float) -> Probe:
        seen.append(scale)
        share = 1.0 if scale <= true_capacity else 0.98 - 0.01 * (scale - true_capacity)
        return Probe(scale, share, 0.1, 0.2, 100.0 / scale)

    return seen, measure


@pytest.mark.parametrize("true_capacity", [0.05, 0.37, 1.0, 1.9, 7.3, 100.0])
@pytest.mark.parametrize("start", [0.5, 1.0, 3.0])
def test_bisection_lands_within_the_precision_below_the_true_capacity(
    true_capacity: float, start: float
) -> None:
    seen, measure = monotone(true_capacity)
    found, probes = bisect_capacity(measure, start=start, precision=0.02)  # type: ignore[arg-type]
    assert found is not None
    assert found.rate_scale <= true_capacity  # measured to meet the target
    assert true_capacity / found.rate_scale <= 1.02 + 1e-9  # and within 2 % of the crossing
    assert [p.rate_scale for p in probes] == seen  # every probe is reported, in order
    assert len(probes) <= 20


def test_bisection_reports_nothing_when_even_the_lowest_scale_fails() -> None:
    _, measure = monotone(MIN_SCALE / 2)
    found, probes = bisect_capacity(measure)  # type: ignore[arg-type]
    assert found is None
    assert probes[-1].rate_scale == MIN_SCALE


def test_bisection_stops_at_the_highest_scale() -> None:
    _, measure = monotone(math.inf)
    found, _ = bisect_capacity(measure)  # type: ignore[arg-type]
    assert found is not None and found.rate_scale == MAX_SCALE


def test_bisection_rejects_a_bad_start() -> None:
    _, measure = monotone(1.0)
    for start in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            bisect_capacity(measure, start=start)  # type: ignore[arg-type]


def test_capacity_document_orders_policies_by_what_they_carry() -> None:
    """A real (small) search: least-tokens carries more than round-robin on two instances, and
    the comparison at the best other's capacity re-runs the judged policy there."""
    trace = open_workload("synthetic:duration_s=120", seed=1)
    document = capacities(
        trace, fleet_of(2), ["least-tokens", "round-robin"], SimConfig(seed=1), precision=0.1
    )
    found = document["capacity"]
    assert isinstance(found, dict)
    for name in ("least-tokens", "round-robin"):
        assert set(found[name]) >= {"rate_scale", "ttft_p50_s", "ttft_p95_s", "goodput_tokens_per_s"}
        assert found[name]["interactive_slo_share"] >= 0.99
        assert found[name]["cost_per_million_goodput_tokens"] > 0  # the profile's price, per good token
        # the last failing probe is within 10 % above the answer
        failing = [p["rate_scale"] for p in found[name]["probes"] if p["interactive_slo_share"] < 0.99]
        assert (
            min(f for f in failing if f > found[name]["rate_scale"]) / found[name]["rate_scale"] <= 1.1 + 1e-9
        )
    assert found["least-tokens"]["rate_scale"] > found["round-robin"]["rate_scale"]
    compared = document["compared_at"]
    assert isinstance(compared, dict)
    assert compared["reference"] == "round-robin"
    assert compared["rate_scale"] == found["round-robin"]["rate_scale"]
    assert set(compared["policies"]) == {"least-tokens", "round-robin"}


def test_a_floor_keeps_a_hopeless_search_short() -> None:
    _, measure = monotone(0.1)
    found, probes = bisect_capacity(measure, start=2.0, min_scale=0.5)  # type: ignore[arg-type]
    assert found is None
    assert [p.rate_scale for p in probes] == [2.0, 1.0, 0.5]
