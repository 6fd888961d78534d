"""Latency and goodput metrics of one run, exactly as DESIGN.md defines them.

The measurement window W is the same for every policy: the workload's arrival span. When that
span has zero length (every request arrived at one instant), W instead runs from that instant to
the last end of any attempt, and at least 1 s (``measurement_window``): the run is judged over
its whole length, not over an empty window that nothing completes in. Traces whose arrivals
span any time keep the arrival span. Counts and percentiles are over the cohort of requests
whose first attempt arrived in W (the simulation runs until every attempt ended); rates count
what happened inside W and divide by |W|:

- ``output_tokens_per_s``: every output token generated inside W, aborted attempts included;
- ``goodput_tokens_per_s``: output tokens of requests that completed inside W and met every
  threshold of their SLO class; ``compliant_share`` = goodput / output throughput;
- percentiles over every request of the cohort, by nearest rank: a request that never got its
  first token (aborted, rejected) has an infinite TTFT (and E2E), written as null when a
  percentile lands on it, so no policy improves its percentiles by losing requests. TTFT and
  E2E are counted from the request's first arrival (a retry does not reset the clock); TPOT
  over completed requests with at least two output tokens;
- ``cache_hit_ratio``: prompt tokens served from the prefix cache / prompt tokens, over
  attempts admitted to an instance;
- ``busy_fraction``: the share of the time the instances held their GPUs inside W (all of W
  for a fleet that never changes) that they spent running steps (None when W was
  extended past the arrival span: the simulator only measures busy time inside that span);
- ``ttft_quantiles_s``: the TTFT at percentiles 0, 1, ..., 100 of the cohort (for CDFs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from agents.policy.common import timing
from agents.policy.common.slo import SloClass, meets_slo
from sim.engine.attempt import Attempt

Metrics = dict[str, float | int | None]


@dataclass(slots=True)
class RequestOutcome:
    """What happened to one request over all its attempts."""

    request_id: str
    slo_class: str
    status: str  # ok | aborted | rejected (of the last attempt)
    ttft_s: float
    tpot_s: float | None
    e2e_s: float
    good: bool
    good_tokens: int
    generated_tokens: int
    wasted_tokens: int
    retries: int
    cached_tokens: int
    admitted_input_tokens: int


MIN_EXTENDED_WINDOW_S = 1.0
"""Shortest window of a run whose requests all arrived at one instant."""


def measurement_window(attempts: Iterable[Attempt], arrivals: tuple[float, float]) -> tuple[float, float]:
    """The window W of a run whose first arrivals span ``arrivals``: that span if it has any
    length, else from the one arrival instant to the last end of any attempt, at least
    ``MIN_EXTENDED_WINDOW_S`` long."""
    start, end = arrivals
    if end > start:
        return arrivals
    last = max((a.end_s for a in attempts if a.end_s is not None), default=start)
    return (start, max(last, start + MIN_EXTENDED_WINDOW_S))


def outcomes(
    attempts: Iterable[Attempt],
    window: tuple[float, float],
    slo_classes: dict[str, SloClass],
    closed_at_end: bool = True,
) -> list[RequestOutcome]:
    """Group attempts by request and judge each request of the window's cohort.

    ``closed_at_end``: the attempts' ``tokens_in_window`` were recorded at ``window[1]`` (the
    simulator closes its window at the last arrival); False when W was extended past it, so
    those counts are ignored and every attempt that ended in W counts all its tokens."""
    by_request: dict[str, list[Attempt]] = {}
    for attempt in attempts:
        by_request.setdefault(attempt.request.request_id, []).append(attempt)
    result = []
    for tries in by_request.values():
        tries.sort(key=lambda a: a.attempt)
        first, last = tries[0], tries[-1]
        if not window[0] <= first.arrival_s <= window[1]:
            continue
        request = last.request
        observed = timing.ttft(last.first_token_s, first.arrival_s)  # from the request's first arrival
        ttft = math.inf if observed is None else observed
        completed = last.status == "ok"
        tpot = timing.tpot(last.first_token_s, last.end_s, last.generated) if completed else None
        e2e = last.end_s - first.arrival_s if completed and last.end_s is not None else math.inf
        good = completed and meets_slo(slo_classes[request.slo_class], ttft, tpot, e2e, request.deadline_s)
        in_window = last.end_s is not None and last.end_s <= window[1]
        admitted = [a for a in tries if a.admitted_s is not None]
        result.append(
            RequestOutcome(
                request_id=request.request_id,
                slo_class=request.slo_class,
                status=last.status,
                ttft_s=ttft,
                tpot_s=tpot,
                e2e_s=e2e,
                good=good,
                good_tokens=last.generated if good and in_window else 0,
                generated_tokens=sum(tokens_in_window(a, window[1], closed_at_end) for a in tries),
                wasted_tokens=sum(a.generated for a in tries if a.status in ("aborted", "failed")),
                retries=len(tries) - 1,
                cached_tokens=sum(a.cached_tokens for a in admitted),
                admitted_input_tokens=sum(a.request.input_tokens for a in admitted),
            )
        )
    return result


def tokens_in_window(attempt: Attempt, window_end: float, closed_at_end: bool = True) -> int:
    """Output tokens ``attempt`` generated before the window closed (``closed_at_end``: as in
    ``outcomes``)."""
    if closed_at_end and attempt.tokens_in_window is not None:
        return attempt.tokens_in_window  # it was still running at the close
    if attempt.end_s is not None and attempt.end_s <= window_end:
        return attempt.generated
    return 0  # it arrived after the close (a late retry)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank ``q``-th percentile (0-100) of the values that are not NaN; None for no such
    values or an infinite result. The one percentile of the project (simulator, benchmarks)."""
    array = np.asarray(values, dtype=np.float64)
    array = array[~np.isnan(array)]
    if len(array) == 0:
        return None
    value = float(np.percentile(array, q, method="inverted_cdf"))
    return None if math.isinf(value) else value


def summarize(requests: Sequence[RequestOutcome], window_s: float, busy_fraction: float | None) -> Metrics:
    """The metric keys of the simulate JSON for one set of requests."""
    ttft = [r.ttft_s for r in requests]
    tpot = [r.tpot_s for r in requests if r.tpot_s is not None]
    e2e = [r.e2e_s for r in requests]
    generated = sum(r.generated_tokens for r in requests)
    good = sum(r.good_tokens for r in requests)
    admitted = sum(r.admitted_input_tokens for r in requests)
    return {
        "requests": len(requests),
        "completed": sum(r.status == "ok" for r in requests),
        "rejected": sum(r.status == "rejected" for r in requests),
        "aborted": sum(r.status == "aborted" for r in requests),
        "failed": sum(r.status == "failed" for r in requests),
        "retried": sum(r.retries for r in requests),
        "wasted_tokens": sum(r.wasted_tokens for r in requests),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p95_s": percentile(ttft, 95),
        "ttft_p99_s": percentile(ttft, 99),
        "tpot_p50_s": percentile(tpot, 50),
        "tpot_p95_s": percentile(tpot, 95),
        "e2e_p95_s": percentile(e2e, 95),
        "cache_hit_ratio": sum(r.cached_tokens for r in requests) / admitted if admitted else 0.0,
        "output_tokens_per_s": generated / window_s,
        "goodput_tokens_per_s": good / window_s,
        "compliant_share": good / generated if generated else 0.0,
        "busy_fraction": busy_fraction,
    }


WARM_UP_SHARE = 0.1
"""Share of the window (from its start) whose predictions are not scored: calibration time."""


def prediction_mape(attempts: Iterable[Attempt], window: tuple[float, float]) -> float | None:
    """Mean |predicted - actual| / actual TTFT over attempts that got a first token, were
    predicted at decision time and arrived after the warm-up; None if the policy predicts none."""
    warm = window[0] + WARM_UP_SHARE * (window[1] - window[0])
    errors = [
        abs(a.predicted_ttft_s - ttft) / ttft
        for a in attempts
        if a.predicted_ttft_s is not None
        and a.first_token_s is not None
        and a.arrival_s >= warm
        and (ttft := a.first_token_s - a.arrival_s) > 0
    ]
    return float(np.mean(errors)) if errors else None


def judged(
    attempts: Sequence[Attempt], arrivals: tuple[float, float], slo_classes: dict[str, SloClass]
) -> list[RequestOutcome]:
    """The outcome of every request of the run's cohort, over its ``measurement_window``."""
    window = measurement_window(attempts, arrivals)
    return outcomes(attempts, window, slo_classes, closed_at_end=window == arrivals)


def report(
    attempts: Iterable[Attempt],
    window: tuple[float, float],
    slo_classes: dict[str, SloClass],
    busy_s: Sequence[float] | None,
    requests: Sequence[RequestOutcome] | None = None,
    held_s: Sequence[float] | None = None,
) -> dict[str, object]:
    """Metrics in total and ``per_class``, rounded so equal runs print equal JSON. ``window`` is
    the arrival span; the metrics are taken over ``measurement_window`` of it. ``requests``:
    the run's ``judged`` outcomes, if the caller has them already; ``held_s``: the seconds of
    the window each instance held its GPUs (default: all of it)."""
    attempts = list(attempts)
    arrivals = window
    window = measurement_window(attempts, arrivals)
    extended = window != arrivals
    if requests is None:
        requests = judged(attempts, arrivals, slo_classes)
    window_s = max(window[1] - window[0], 1e-9)
    held = len(busy_s or ()) * window_s if held_s is None else max(sum(held_s), 1e-9)
    busy = None if busy_s is None or extended else sum(busy_s) / held
    total: dict[str, object] = dict(_rounded(summarize(requests, window_s, busy)))
    mape = prediction_mape(attempts, arrivals)
    total["ttft_prediction_mape"] = None if mape is None else round(mape, 6)
    total["ttft_quantiles_s"] = ttft_quantiles(requests)
    classes = sorted({r.slo_class for r in requests})
    total["per_class"] = {
        name: _rounded(summarize([r for r in requests if r.slo_class == name], window_s, busy))
        for name in classes
    }
    return total


QUANTILES = tuple(range(0, 101))
"""Percentiles kept of the TTFT distribution (for CDF plots): 0, 1, ..., 100."""


def ttft_quantiles(requests: Sequence[RequestOutcome]) -> list[float | None]:
    """TTFT at each of ``QUANTILES`` (nearest rank; None where it lands on a request that never
    got a first token), so a CDF can be drawn from the JSON alone."""
    ttft = [r.ttft_s for r in requests]
    return [None if (v := percentile(ttft, q)) is None else round(v, 6) for q in QUANTILES]


def _rounded(metrics: Metrics) -> Metrics:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in metrics.items()}
