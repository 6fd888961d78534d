"""Regret of admission, counted on hand-built runs: what a policy rejected that its twin without
admission served within the objective."""

from __future__ import annotations

import pytest

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from agents.policy.registry import PolicyError
from sim.evaluation.metrics import judged
from sim.evaluation.regret import pass_through_twin, rejected_met_without_admission
from tests.unit.sim.test_metrics import attempt

SLO = dict(DEFAULT_SLO_CLASSES)


def test_the_twin_is_the_same_stages_without_admission() -> None:
    assert pass_through_twin("slomax+tokenpilot") == "tokenpilot"
    assert pass_through_twin("slomax+fleetmind+tokenpilot") == "fleetmind+tokenpilot"
    assert pass_through_twin("tokenpilot") is None
    with pytest.raises(PolicyError):
        pass_through_twin("slomax+nonesuch")


def test_regret_counts_only_rejects_the_twin_served_within_their_objective() -> None:
    with_admission = [
        attempt("a", 0.0, None, 0.0, 0, "rejected"),  # the twin met it: regret
        attempt("b", 1.0, None, 1.0, 0, "rejected"),  # the twin missed it (TTFT 3 s): right call
        attempt("c", 2.0, None, 2.0, 0, "rejected", slo="long_context"),  # twin met it: regret
        attempt("d", 3.0, 3.5, 5.0, 100, "ok"),  # served by both: no regret
        attempt("e", 4.0, None, 14.0, 0, "aborted"),  # its client gave up: not a reject
    ]
    twin = [
        attempt("a", 0.0, 0.5, 2.0, 100, "ok"),
        attempt("b", 1.0, 4.0, 5.0, 100, "ok"),
        attempt("c", 2.0, 8.0, 12.0, 100, "ok", slo="long_context"),
        attempt("d", 3.0, 3.5, 5.0, 100, "ok"),
        attempt("e", 4.0, 4.5, 6.0, 100, "ok"),
    ]
    arrivals = (0.0, 4.0)
    regret = rejected_met_without_admission(
        judged(with_admission, arrivals, SLO), judged(twin, arrivals, SLO)
    )
    assert regret == {"interactive": 1, "long_context": 1, "all": 2}
