"""Several policies side by side on one workload and one fleet: same seed, same clients.

With several planners (``sim/loop/planning.py``) every policy runs under each, and a result's
key is ``POLICY@PLANNER``; with one, the key is the policy's name. Every result says which
``planner`` shaped its fleet and carries the shape's figures (``sim/loop/replicas.py``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agents.policy.registry import PolicyError, StageParams, params_for, parse_policy
from agents.policy.types import BLOCK_TOKENS
from sim.engine.fleet import FleetSpec
from sim.evaluation.cost import costs
from sim.evaluation.ideal import ideal_attempts
from sim.evaluation.metrics import RequestOutcome, judged, report
from sim.evaluation.regret import pass_through_twin, rejected_met_without_admission
from sim.evaluation.violations import judge_run
from sim.loop.config import SimConfig
from sim.loop.planning import planner_for
from sim.loop.results import RunResult
from sim.loop.runner import simulate
from sim.workloads.trace import Workload

IDEAL = "ideal"
IDEAL_FLEET_CACHE = "ideal-fleet-cache"
BOUNDS = (IDEAL, IDEAL_FLEET_CACHE)
"""Latency floors reported beside the policies; not policies (``sim/evaluation/ideal.py``)."""


def check_policies(policies: Sequence[str], params: StageParams | None = None) -> None:
    """``PolicyError`` (a ``ValueError``) naming the known stages if a name is not a policy, or
    if ``params`` configures a stage none of the policies uses."""
    used: set[str] = set()
    for name in policies:
        if name not in BOUNDS:
            used.update(parse_policy(name))
    unused = sorted(set(params or {}) - used)
    if unused:
        raise PolicyError(f"parameters for {', '.join(unused)}, which no policy compared here uses")


@dataclass(frozen=True, slots=True)
class Timing:
    policy: str
    wall_s: float
    requests: int


ProgressFactory = Callable[[str, int], Callable[[int], None]]


def compare(
    workload: Workload,
    fleet: FleetSpec,
    policies: Sequence[str],
    config: SimConfig,
    rate_scale: float = 1.0,
    progress: ProgressFactory | None = None,
    params: StageParams | None = None,
    planners: Sequence[str] = ("static",),
) -> tuple[dict[str, object], list[Timing]]:
    """The simulate JSON document and, separately, wall-clock timings (not part of the JSON,
    so the same seed gives byte-identical JSON). ``params``: stage parameters (registry).
    With a fleet file, each policy's result has ``violations`` (``violations.py``)."""
    check_policies(policies, params)
    scaled = workload.scaled(rate_scale)
    twins = {name: twin for name in policies if name not in BOUNDS and (twin := pass_through_twin(name))}
    runs = [*policies, *(t for t in dict.fromkeys(twins.values()) if t not in policies)]
    results: dict[str, dict[str, object]] = {}
    requests: dict[str, list[RequestOutcome]] = {}
    timings = []
    several = len(planners) > 1
    for planner in planners:
        for name in runs:
            key = f"{name}@{planner}" if several and name not in BOUNDS else name
            if key in results:
                continue  # a bound is the same under every planner
            started = time.perf_counter()
            if name in BOUNDS:
                window = (scaled.requests[0].arrival_s, scaled.requests[-1].arrival_s)
                blocks = sum(spec.profile.kv_tokens // BLOCK_TOKENS for spec in fleet.instances)
                cache = blocks if name == IDEAL_FLEET_CACHE else None
                attempts = ideal_attempts(scaled, fleet, config.budget_for, window[1], cache)
                results[key] = report(attempts, window, config.slo_classes, None)
            else:
                tick = progress(key, len(scaled.requests)) if progress else None
                shaper = planner_for(planner, fleet, config)
                run = simulate(scaled, fleet, name, config, tick, params_for(name, params), None, shaper)
                requests[key] = judged(run.attempts, run.window, config.slo_classes)
                results[key] = _result(run, requests[key], config)
                violations = judge_run(run, fleet, config.heartbeat_s)
                if violations is not None:  # a fleet file: its rules judged (``violations.py``)
                    results[key]["violations"] = violations
            timings.append(Timing(key, time.perf_counter() - started, len(scaled.requests)))
        for name, twin in twins.items():
            key, twin_key = (f"{name}@{planner}", f"{twin}@{planner}") if several else (name, twin)
            regret = rejected_met_without_admission(requests[key], requests[twin_key])
            _add_regret(results[key], twin_key, regret)
    document = {
        "workload": workload.name,
        "fleet": fleet.name,
        "instances": len(fleet.instances),
        "rate_scale": rate_scale,
        "seed": config.seed,
        "heartbeat_s": config.heartbeat_s,
        **config.deciders_fields(),
        "requests": len(scaled.requests),
        "window_s": round(scaled.requests[-1].arrival_s - scaled.requests[0].arrival_s, 6),
        "results": results,
    }
    return document, timings


def _result(run: RunResult, requests: list[RequestOutcome], config: SimConfig) -> dict[str, object]:
    """One run's metrics (``metrics.py``), costs (``cost.py``), its planner and its shape, and
    on a fleet that can disaggregate, its KV transfers (``KvLinks.figures``)."""
    result = report(run.attempts, run.window, config.slo_classes, run.busy_s, requests, run.held_s)
    _add_costs(result, costs(run.attempts, requests, run.instances, run.busy_s, run.held_s))
    result["planner"] = run.planner
    result.update(run.shape)
    if run.kv_links.get("kv_transfers") or any(spec.role != "both" for spec in run.instances):
        result.update(run.kv_links)
    return result


def _add_regret(result: dict[str, object], twin: str, regret: dict[str, int]) -> None:
    """``rejected_met_without_admission`` (``regret.py``) into a policy's totals and classes."""
    result["regret_twin"] = twin
    result["rejected_met_without_admission"] = regret["all"]
    per_class = result["per_class"]
    assert isinstance(per_class, dict)
    for name, metrics in per_class.items():
        metrics["rejected_met_without_admission"] = regret.get(name, 0)


def _add_costs(result: dict[str, object], spend: dict[str, object]) -> None:
    """The figures of ``cost.py`` into a policy's totals, its classes, and ``per_tenant``."""
    total, classes = spend["total"], spend["per_class"]
    assert isinstance(total, dict) and isinstance(classes, dict)
    result.update(total)
    per_class = result["per_class"]
    assert isinstance(per_class, dict)
    for name, metrics in per_class.items():
        metrics.update(classes.get(name, {}))
    result["per_tenant"] = spend["per_tenant"]
