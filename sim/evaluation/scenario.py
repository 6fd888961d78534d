"""Multi-DC scenarios judged: the simulate JSON plus what FleetMind is judged by.

Per policy, beside the usual metrics (``metrics.report``):

- ``violations``: sends that broke the fleet file's rules, per kind (permission, residency,
  version, model, not ready, cut off) and their ``total``, judged from the fleet file and the
  run's sends by ``sim/evaluation/violations.py`` (which shares no code with the policies);
- ``hotspot``: the metrics of the requests that arrived inside the hot-spot window (goodput
  over that window);
- ``diverted``: requests that ran outside their home DC: how many, their client-side TTFT P50 /
  P95 (network round trip included) and the share within their class's TTFT objective;
- ``outages``: per simulated outage of DC d (down at t0, up at t1): ``sent_after_detection`` =
  attempts sent to d in (t0 + 2 heartbeat intervals, t1), ``last_sent_after_down_s``;
  ``goodput_recovered_after_s`` = from t1 to the start of the first 5 s arrival bin whose
  goodput is at least 90 % of the mean over the 30 s before t0 (0 when it never fell below);
  ``dc_share_before`` / ``dc_share_recovered_after_s``: d's share of sends before t0, and from
  t1 until a 5 s bin reaches half of it again (traffic returning);
- ``notices``: FleetMind's notices by kind, and the first ones in full (when and why).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from agents.policy.fleetmind.capacity import STALE_AFTER_HEARTBEATS
from agents.policy.registry import StageParams, params_for
from sim.engine.attempt import Attempt
from sim.evaluation.compare import check_policies
from sim.evaluation.metrics import outcomes, percentile, report, summarize
from sim.evaluation.violations import judge_run
from sim.loop.config import SimConfig
from sim.loop.deciders import caption
from sim.loop.results import RunResult
from sim.loop.runner import simulate
from sim.scenarios import Scenario

BIN_S = 5.0
BEFORE_S = 30.0
NOTICES_SHOWN = 40
DEFAULT_POLICIES = ("fleetmind+tokenpilot", "local-only+tokenpilot", "global-least-load+tokenpilot")


def run_scenario(
    scenario: Scenario,
    policies: Sequence[str],
    config: SimConfig,
    rate_scale: float = 1.0,
    params: StageParams | None = None,
) -> dict[str, object]:
    """The scenario JSON document: every policy on the same workload, fleet and seed."""
    check_policies(policies, params)
    workload = scenario.workload.scaled(rate_scale)
    results: dict[str, object] = {}
    for name in policies:
        run = simulate(workload, scenario.fleet, name, config, None, params_for(name, params))
        results[name] = policy_result(run, scenario, config, rate_scale)
    return {
        "scenario": scenario.name,
        "description": scenario.description,
        "fleet": scenario.fleet.name,
        "instances": len(scenario.fleet.instances),
        "rate_scale": rate_scale,
        "seed": config.seed,
        "heartbeat_s": config.heartbeat_s,
        **config.deciders_fields(),
        "requests": len(workload.requests),
        "hotspot_window_s": None
        if scenario.hotspot is None
        else [round(t / rate_scale, 3) for t in scenario.hotspot],
        "results": results,
    }


def policy_result(
    run: RunResult, scenario: Scenario, config: SimConfig, rate_scale: float
) -> dict[str, object]:
    """One policy's entry of the scenario document: the simulate JSON's metrics and what
    FleetMind is judged by (violations, the hotspot's cohort, diversions, outages)."""
    result = report(run.attempts, run.window, config.slo_classes, run.busy_s)
    start = run.window[0]
    result["violations"] = judge_run(run, scenario.fleet, config.heartbeat_s)
    if scenario.hotspot is not None:
        low, high = (start + t / rate_scale for t in scenario.hotspot)
        cohort = outcomes(run.attempts, (low, high), config.slo_classes, closed_at_end=False)
        result["hotspot"] = _rounded(summarize(cohort, high - low, None))
    result["diverted"] = _diverted(run.attempts, config)
    result["outages"] = [
        _outage(run.attempts, start + o.down_s, start + o.up_s, o.dc, config) for o in scenario.fleet.outages
    ]
    kinds = Counter(n.kind for n in run.notices)
    result["notices"] = {
        "by_kind": dict(sorted(kinds.items())),
        "first": [
            {
                "kind": n.kind,
                "dc": n.dc,
                "time_s": round(n.time_s - start, 3),
                "detail": n.detail,
                "delta": n.delta,
            }
            for n in run.notices[:NOTICES_SHOWN]
        ],
    }
    return result


def _diverted(attempts: Sequence[Attempt], config: SimConfig) -> dict[str, object]:
    """Requests whose last attempt ran outside their home DC."""
    last: dict[str, Attempt] = {}
    for attempt in attempts:
        if attempt.dc and attempt.attempt >= last.get(attempt.request.request_id, attempt).attempt:
            last[attempt.request.request_id] = attempt
    away = [a for a in last.values() if a.request.home_dc and a.dc != a.request.home_dc]
    arrived: dict[str, float] = {}
    for attempt in attempts:
        rid = attempt.request.request_id
        arrived[rid] = min(arrived.get(rid, attempt.arrival_s), attempt.arrival_s)
    ttfts: dict[str, list[float]] = {}
    within = 0
    for attempt in away:
        first_token = attempt.first_token_s
        ttft = math.inf if first_token is None else first_token - arrived[attempt.request.request_id]
        ttfts.setdefault(attempt.request.slo_class, []).append(ttft)
        slo = config.slo_classes.get(attempt.request.slo_class)
        within += slo is not None and (slo.ttft_s is None or ttft <= slo.ttft_s)
    every = [t for values in ttfts.values() for t in values]
    return {
        "requests": len(away),
        "by_dc": dict(sorted(Counter(a.dc for a in away).items())),
        "ttft_p50_s": _round(percentile(every, 50)),
        "ttft_p95_s": _round(percentile(every, 95)),
        "within_ttft_objective": round(within / len(away), 6) if away else None,
        "per_class": {
            name: {
                "requests": len(values),
                "ttft_p95_s": _round(percentile(values, 95)),
                "ttft_objective_s": getattr(config.slo_classes.get(name), "ttft_s", None),
            }
            for name, values in sorted(ttfts.items())
        },
    }


def _outage(
    attempts: Sequence[Attempt], down: float, up: float, dc: str, config: SimConfig
) -> dict[str, object]:
    sent = [(a.sent_s, a.dc) for a in attempts if a.sent_s is not None]
    detect = down + STALE_AFTER_HEARTBEATS * config.heartbeat_s
    late = [t for t, where in sent if where == dc and detect < t < up]
    during = [t for t, where in sent if where == dc and down <= t < up]
    bins = _goodput_bins(attempts, down - BEFORE_S, max(a.arrival_s for a in attempts), config)
    before = [g for t, g in bins if t < down]
    level = sum(before) / len(before) if before else 0.0
    recovered = next((t - up for t, g in bins if t >= up and g >= 0.9 * level), None)
    before_sent = [where for t, where in sent if down - BEFORE_S <= t < down]
    share = before_sent.count(dc) / len(before_sent) if before_sent else 0.0
    returned = None
    t = up
    while t < up + 600:
        window = [where for at, where in sent if t <= at < t + BIN_S]
        if window and window.count(dc) / len(window) >= share / 2:
            returned = t - up
            break
        t += BIN_S
    return {
        "dc": dc,
        "down_s": round(down - min(a.arrival_s for a in attempts), 3),
        "sent_after_detection": len(late),
        "last_sent_after_down_s": round(max(during) - down, 3) if during else None,
        "goodput_before_tokens_per_s": round(level, 3),
        "goodput_recovered_after_s": None if recovered is None else round(recovered, 3),
        "dc_share_before": round(share, 6),
        "dc_share_recovered_after_s": None if returned is None else round(returned, 3),
    }


def _goodput_bins(
    attempts: Sequence[Attempt], start: float, end: float, config: SimConfig
) -> list[tuple[float, float]]:
    """(bin start, goodput of the requests that arrived in the bin, tokens/s) every ``BIN_S``."""
    bins = []
    t = start
    while t < end:
        cohort = outcomes(attempts, (t, t + BIN_S), config.slo_classes, closed_at_end=False)
        bins.append((t, sum(r.good_tokens for r in cohort) / BIN_S))
        t += BIN_S
    return bins


def _round(value: float | None) -> float | None:
    return None if value is None or math.isinf(value) else round(value, 6)


def _rounded(metrics: dict[str, float | int | None]) -> dict[str, float | int | None]:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in metrics.items()}


def format_scenario(document: dict[str, object]) -> str:
    """The scenario document as a plain table, one line per policy, and the outage figures."""
    results = document["results"]
    assert isinstance(results, dict)
    lines = [
        f"scenario {document['scenario']}: {document['description']}",
        f"{document['requests']} requests, {document['instances']} instances, "
        f"rate scale {document['rate_scale']}, seed {document['seed']}{caption(document)}",
        f"{'policy':34} {'goodput':>9} {'hot-spot':>9} {'TTFT p95':>9} {'diverted':>8} "
        f"{'div p95':>8} {'div in-SLO':>10} {'violations':>10}",
    ]
    for name, result in results.items():
        hot = result.get("hotspot") or {}
        div = result["diverted"]
        lines.append(
            f"{name:34} {_num(result['goodput_tokens_per_s'], 1):>9} "
            f"{_num(hot.get('goodput_tokens_per_s'), 1):>9} {_num(result['ttft_p95_s'], 3):>9} "
            f"{div['requests']:>8} {_num(div['ttft_p95_s'], 3):>8} "
            f"{_num(div['within_ttft_objective'], 3):>10} {result['violations']['total']:>10}"
        )
    for name, result in results.items():
        for o in result["outages"]:
            lines.append(
                f"  {name}: {o['dc']} down at {o['down_s']} s: "
                f"{o['sent_after_detection']} sent after detection, "
                f"goodput back after {_num(o['goodput_recovered_after_s'], 1)} s, traffic back after "
                f"{_num(o['dc_share_recovered_after_s'], 1)} s"
            )
    return "\n".join(lines)


def _num(value: object, digits: int) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.{digits}f}"
