"""The planners benchmark's reference: a planner that knows the future (``bench/planners.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.planners import ORACLE_FLOOR, oracle_gpu_hours
from sim.engine.fleet import fleet_from_doc

pytestmark = pytest.mark.unit


def test_the_bound_holds_each_minute_what_the_coming_demand_needs_at_the_static_fleets_rate() -> None:
    doc = {
        "data_centres": [
            {
                "name": "A",
                "instances": [
                    {"count": 4, "profile": "llama3-8b-h100", "model": "llama3-8b"},
                    {"count": 2, "profile": "llama3-70b-tp4-h100", "model": "llama3-70b"},
                ],
            }
        ]
    }
    fleet = fleet_from_doc(doc, Path("f.yaml"))
    minutes = 10
    static = {
        "timeline": {
            "t_s": [60.0 * k for k in range(minutes)],
            # llama3-8b peaks at 8/s on 4 replicas (2/s each); llama3-70b flat at 1/s on 2 (0.5/s each)
            "demand_per_s": {"llama3-8b": [1.0] * 5 + [8.0] + [1.0] * 4, "llama3-70b": [1.0] * minutes},
        }
    }
    # llama3-8b: 4 replicas (1 GPU each) in the 5 minutes that see the peak coming (minutes 1-5),
    # the floor in the other 5
    small = (4 * 5 + ORACLE_FLOOR * 5) / 60
    # llama3-70b: 2 replicas of 4 GPUs throughout
    large = 2 * 4 * minutes / 60
    assert oracle_gpu_hours(static, fleet) == pytest.approx(small + large)
