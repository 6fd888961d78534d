"""SLO capacity: how much load a policy carries while its interactive requests keep their objective.

    capacity(P, W) = the highest arrival-rate scale s at which share(P, W, s) >= 0.99

share(P, W, s) = interactive requests of the cohort (first attempt arrived in the measurement
window) that completed and met their class's TTFT *and* TPOT thresholds / every interactive
request of the cohort, with W's arrivals ``s`` times as fast (``Workload.scaled``). A request
rejected, aborted or never finished does not meet it.

Found by bisection on the scale, to ``precision`` (2 %): from ``start``, double (or halve) until
a scale that meets the target and one that does not bracket the crossing, then halve the
bracket geometrically until ``high / low <= 1 + precision``; the answer is ``low`` (a scale
that was *run* and met the target). The search assumes share falls as load rises; where a
policy's share is not monotone it finds one crossing, and every probe is kept in the result so
that shows. Every policy gets the same probes' workload, fleet, seed and clients.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from agents.policy.registry import StageParams, params_for
from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec
from sim.evaluation.compare import check_policies
from sim.evaluation.cost import costs
from sim.evaluation.metrics import judged, measurement_window, outcomes, report
from sim.evaluation.violations import judge_run
from sim.loop.config import SimConfig
from sim.loop.deciders import caption
from sim.loop.runner import simulate
from sim.workloads.trace import Workload

INTERACTIVE = "interactive"
DEFAULT_TARGET = 0.99
DEFAULT_PRECISION = 0.02
MIN_SCALE, MAX_SCALE = 1 / 64, 256.0  # the search gives up outside (capacity 0, or "at least")


@dataclass(frozen=True, slots=True)
class Probe:
    """One simulation at ``rate_scale``: the interactive SLO share and the run's totals."""

    rate_scale: float
    interactive_slo_share: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    goodput_tokens_per_s: float
    ttft_prediction_mape: float | None = None  # the policy's own TTFT predictions, after warm-up
    cost_per_million_goodput_tokens: float | None = None  # sim/evaluation/cost.py (None: no price)
    violations: dict[str, int] | None = None  # sim/evaluation/violations.py (None: no fleet file)


Measure = Callable[[float], Probe]


def interactive_share(attempts: Iterable[Attempt], arrivals: tuple[float, float], config: SimConfig) -> float:
    """Share of the cohort's interactive requests that met every threshold (1.0 if none)."""
    attempts = list(attempts)
    window = measurement_window(attempts, arrivals)
    cohort = outcomes(attempts, window, config.slo_classes, closed_at_end=window == arrivals)
    judged = [r for r in cohort if r.slo_class == INTERACTIVE]
    return sum(r.good for r in judged) / len(judged) if judged else 1.0


def probe(
    workload: Workload,
    fleet: FleetSpec,
    policy: str,
    config: SimConfig,
    rate_scale: float,
    params: StageParams | None = None,
) -> Probe:
    """Simulate ``policy`` at ``rate_scale`` and judge the run."""
    run = simulate(workload.scaled(rate_scale), fleet, policy, config, None, params_for(policy, params))
    requests = judged(run.attempts, run.window, config.slo_classes)
    totals = report(run.attempts, run.window, config.slo_classes, run.busy_s, requests)
    spend = costs(run.attempts, requests, run.instances, run.busy_s, run.held_s)["total"]
    assert isinstance(spend, dict)
    return Probe(
        rate_scale=rate_scale,
        interactive_slo_share=round(interactive_share(run.attempts, run.window, config), 6),
        ttft_p50_s=totals["ttft_p50_s"],  # type: ignore[arg-type]
        ttft_p95_s=totals["ttft_p95_s"],  # type: ignore[arg-type]
        goodput_tokens_per_s=totals["goodput_tokens_per_s"],  # type: ignore[arg-type]
        ttft_prediction_mape=totals["ttft_prediction_mape"],  # type: ignore[arg-type]
        cost_per_million_goodput_tokens=spend["cost_per_million_goodput_tokens"],
        violations=judge_run(run, fleet, config.heartbeat_s),
    )


def bisect_capacity(
    measure: Measure,
    start: float = 1.0,
    precision: float = DEFAULT_PRECISION,
    target: float = DEFAULT_TARGET,
    min_scale: float = MIN_SCALE,
) -> tuple[Probe | None, list[Probe]]:
    """The highest probed scale meeting ``target`` with a failing one within ``1 + precision``
    above it, and every probe in the order made. ``None`` when even ``min_scale`` fails (a
    slower trace takes longer to simulate: a floor keeps a hopeless search short); the last
    probe (at ``MAX_SCALE``) when nothing up to it fails."""
    if not (math.isfinite(start) and start > 0 and precision > 0):
        raise ValueError("start must be a finite scale > 0 and precision > 0")
    probes: list[Probe] = []

    def at(scale: float) -> Probe:
        result = measure(scale)
        probes.append(result)
        return result

    first = at(start)
    low: Probe | None = first if first.interactive_slo_share >= target else None
    high: Probe | None = None if low is not None else first
    while low is None:  # halve until a scale meets the target
        assert high is not None
        if high.rate_scale <= min_scale:
            return None, probes
        candidate = at(max(high.rate_scale / 2, min_scale))
        low, high = (candidate, high) if candidate.interactive_slo_share >= target else (None, candidate)
    while high is None:  # double until one does not
        if low.rate_scale >= MAX_SCALE:
            return low, probes
        candidate = at(min(low.rate_scale * 2, MAX_SCALE))
        low, high = (candidate, None) if candidate.interactive_slo_share >= target else (low, candidate)
    while high.rate_scale / low.rate_scale > 1 + precision:
        middle = at(math.sqrt(low.rate_scale * high.rate_scale))
        low, high = (middle, high) if middle.interactive_slo_share >= target else (low, middle)
    return low, probes


@dataclass(frozen=True, slots=True)
class Capacity:
    policy: str
    result: Probe | None  # None: not even the lowest scale probed meets the target
    probes: tuple[Probe, ...]

    def document(self) -> dict[str, object]:
        """The JSON of one policy: the four keys of the contract, then the search."""
        found = self.result
        return {
            "rate_scale": None if found is None else round(found.rate_scale, 4),
            "below": min(p.rate_scale for p in self.probes) if found is None else None,
            "ttft_p50_s": None if found is None else found.ttft_p50_s,
            "ttft_p95_s": None if found is None else found.ttft_p95_s,
            "goodput_tokens_per_s": None if found is None else found.goodput_tokens_per_s,
            "interactive_slo_share": None if found is None else found.interactive_slo_share,
            "ttft_prediction_mape": None if found is None else found.ttft_prediction_mape,
            "cost_per_million_goodput_tokens": None
            if found is None
            else found.cost_per_million_goodput_tokens,
            "violations": None if found is None else found.violations,
            "probes": [asdict(p) for p in self.probes],
        }


def _capacity_of(
    args: tuple[Workload, FleetSpec, str, SimConfig, float, float, StageParams | None, float],
) -> Capacity:
    workload, fleet, policy, config, start, precision, params, min_scale = args
    found, probes = bisect_capacity(
        lambda scale: probe(workload, fleet, policy, config, scale, params),
        start,
        precision,
        min_scale=min_scale,
    )
    return Capacity(policy, found, tuple(probes))


def capacities(
    workload: Workload,
    fleet: FleetSpec,
    policies: Sequence[str],
    config: SimConfig,
    start: float = 1.0,
    precision: float = DEFAULT_PRECISION,
    params: StageParams | None = None,
    jobs: int = 1,
    references: Sequence[str] | None = None,
    min_scale: float = MIN_SCALE,
) -> dict[str, object]:
    """The capacity JSON: ``{"capacity": {POLICY: {...}}, "compared_at": {...}, ...}``.

    ``compared_at``: every policy at the capacity of the best of ``references`` (default: every
    policy but the first, the one being judged: "at the best peer's capacity, how do we do?")."""
    check_policies(policies, params)
    tasks = [(workload, fleet, name, config, start, precision, params, min_scale) for name in policies]
    if jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks))) as pool:
            found = list(pool.map(_capacity_of, tasks))
    else:
        found = [_capacity_of(task) for task in tasks]
    document: dict[str, object] = {
        "workload": workload.name,
        "fleet": fleet.name,
        "seed": config.seed,
        "heartbeat_s": config.heartbeat_s,
        "signal_delay_s": config.signal_delay_s,
        **config.deciders_fields(),
        "target_interactive_slo_share": DEFAULT_TARGET,
        "precision": precision,
        "capacity": {c.policy: c.document() for c in found},
    }
    chosen = set(references) if references is not None else {c.policy for c in found[1:]}
    others = [c for c in found if c.policy in chosen and c.result is not None]
    if others:
        reference = max(others, key=lambda c: c.result.rate_scale if c.result else 0.0)
        assert reference.result is not None
        scale = reference.result.rate_scale
        document["compared_at"] = {
            "reference": reference.policy,
            "rate_scale": round(scale, 4),
            "policies": {
                c.policy: asdict(
                    reference.result
                    if c is reference
                    else probe(workload, fleet, c.policy, config, scale, params)
                )
                for c in found
            },
        }
    return document


def format_capacity(document: Mapping[str, Any]) -> str:
    """The capacity table (markdown): per policy its capacity and the run there, and with a
    fleet file the violations of its rules in that run (``violations.py``)."""
    judged = any(c.get("violations") is not None for c in document["capacity"].values())
    extra_head, extra_rule = (" violations |", "---|") if judged else ("", "")
    rows = [
        f"SLO capacity on {document['workload']} ({document['fleet']}, seed {document['seed']}, "
        f"heartbeat {document['heartbeat_s']} s, signal delay {document['signal_delay_s']} s"
        f"{caption(document)}): the "
        f"highest rate scale with >= {document['target_interactive_slo_share']:.0%} of interactive "
        f"requests within TTFT and TPOT, to {document['precision']:.0%}",
        "",
        "| policy | capacity (x rate) | TTFT p50 | TTFT p95 | goodput tok/s | $ per M good tokens "
        f"| interactive in SLO | probes |{extra_head}",
        f"|---|---|---|---|---|---|---|---|{extra_rule}",
    ]
    for name, c in document["capacity"].items():
        scale = "< " + _num(c["below"]) if c["rate_scale"] is None else _num(c["rate_scale"])
        rows.append(
            f"| {name} | {scale} | {_sec(c['ttft_p50_s'])} | {_sec(c['ttft_p95_s'])} "
            f"| {_num(c['goodput_tokens_per_s'], 0)} | {_num(c.get('cost_per_million_goodput_tokens'), 3)} "
            f"| {_share(c['interactive_slo_share'])} "
            f"| {len(c['probes'])} |{_violations(c) if judged else ''}"
        )
    compared = document.get("compared_at")
    if compared:
        rows += [
            "",
            f"At {compared['reference']}'s capacity (x{_num(compared['rate_scale'])}):",
            "",
            f"| policy | TTFT p50 | TTFT p95 | goodput tok/s | interactive in SLO |{extra_head}",
            f"|---|---|---|---|---|{extra_rule}",
        ]
        for name, p in compared["policies"].items():
            rows.append(
                f"| {name} | {_sec(p['ttft_p50_s'])} | {_sec(p['ttft_p95_s'])} "
                f"| {_num(p['goodput_tokens_per_s'], 0)} | {_share(p['interactive_slo_share'])} |"
                f"{_violations(p) if judged else ''}"
            )
    return "\n".join(rows)


def _violations(result: Mapping[str, Any]) -> str:
    """A table cell: the run's total violations ("-": not counted)."""
    found = result.get("violations")
    return f" {'-' if found is None else found['total']} |"


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _sec(value: float | None) -> str:
    return "∞" if value is None else f"{value:.3f} s"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"
