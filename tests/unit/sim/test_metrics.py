"""Metric definitions on hand-built outcomes."""

from __future__ import annotations

import math

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from sim.engine.attempt import Attempt
from sim.evaluation.metrics import percentile, prediction_mape, report
from tests.unit.sim.helpers import request


def attempt(
    rid: str,
    arrival: float,
    first: float | None,
    end: float,
    tokens: int,
    status: str,
    n: int = 1,
    slo: str | None = None,
    deadline: float | None = None,
) -> Attempt:
    trace = request(rid, arrival, 1000, max(tokens, 1), slo_class=slo, deadline_s=deadline)
    a = Attempt(trace, n, arrival, 4096)
    a.first_token_s, a.end_s, a.generated, a.status = first, end, tokens, status
    return a


def test_lost_requests_have_infinite_ttft_so_percentiles_cannot_improve_by_losing() -> None:
    assert percentile([1.0, 2.0, math.inf, math.inf], 50) == 2.0
    assert percentile([1.0, 2.0, math.inf, math.inf], 95) is None
    assert percentile([], 50) is None


def test_goodput_throughput_and_compliant_share() -> None:
    attempts = [
        attempt("fast", 0.0, 0.5, 2.0, 100, "ok"),  # meets 2 s TTFT, TPOT 1.5/99
        attempt("slow", 1.0, 4.0, 5.0, 50, "ok"),  # TTFT 3 s: completed, not compliant
        attempt("gone", 2.0, None, 12.0, 0, "aborted"),
        attempt("gone", 12.0, 12.5, 14.0, 30, "ok", n=2),  # retry: TTFT from first arrival = 10.5
        attempt("cut", 3.0, 3.5, 10.0, 40, "aborted", slo="batch", deadline=7.0),
        attempt("job", 10.0, 11.0, 15.0, 20, "ok", slo="batch", deadline=100.0),
    ]
    attempts[-1].tokens_in_window = 5  # still running when the window closed at 10 s
    m = report(attempts, (0.0, 10.0), DEFAULT_SLO_CLASSES, [5.0, 10.0])
    assert m["completed"] == 4 and m["aborted"] == 1 and m["retried"] == 1
    assert m["wasted_tokens"] == 40
    # Inside the window: fast 100, slow 50, cut 40 (aborted, still counted), job 5 so far;
    # the retry of "gone" arrived after the close.
    assert m["output_tokens_per_s"] == (100 + 50 + 40 + 5) / 10
    # Only "fast" completed inside the window and met its class ("job" completes at 15 s).
    assert m["goodput_tokens_per_s"] == 100 / 10
    assert m["compliant_share"] == round(100 / 195, 6)
    assert m["busy_fraction"] == 0.75
    per_class = m["per_class"]
    assert isinstance(per_class, dict)
    assert per_class["batch"]["output_tokens_per_s"] == 4.5
    assert per_class["interactive"]["ttft_p50_s"] == 3.0  # [0.5, 3, 10.5]


def test_prediction_mape_scores_predictions_after_the_warm_up_only() -> None:
    early = attempt("early", 0.0, 1.0, 2.0, 10, "ok")  # inside the first 10 % of the window
    exact = attempt("exact", 50.0, 52.0, 60.0, 10, "ok")
    double = attempt("double", 60.0, 61.0, 70.0, 10, "ok")
    gone = attempt("gone", 70.0, None, 80.0, 0, "aborted")  # no first token: nothing to score
    early.predicted_ttft_s, exact.predicted_ttft_s, double.predicted_ttft_s = 9.0, 2.0, 2.0
    gone.predicted_ttft_s = 1.0
    attempts = [early, exact, double, gone, attempt("end", 100.0, 100.5, 101.0, 10, "ok")]
    assert prediction_mape(attempts, (0.0, 100.0)) == 0.5  # (0 + 1) / 2
    assert report(attempts, (0.0, 100.0), DEFAULT_SLO_CLASSES, None)["ttft_prediction_mape"] == 0.5
    for a in attempts:
        a.predicted_ttft_s = None
    assert prediction_mape(attempts, (0.0, 100.0)) is None  # a policy that predicts nothing
