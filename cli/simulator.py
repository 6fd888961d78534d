"""The simulator's commands: ``simulate``, ``capacity``, ``tail``, ``report``, ``generate``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.choices import PlannerOpt, checked_planners, checked_policies, no_bounds
from cli.options import (
    DEFAULT_FLEET,
    MAX_SECONDS,
    POLICY_HELP,
    WORKLOAD_HELP,
    DecidersOpt,
    DeciderSplitOpt,
    DecisionLogDelayOpt,
    FleetOpt,
    HeartbeatOpt,
    JitterOpt,
    JsonOpt,
    OutputBudgetOpt,
    PolicyConfigOpt,
    ProfilesOpt,
    RateScaleOpt,
    RetryShareOpt,
    ScenarioOpt,
    SeedOpt,
    SignalDelayOpt,
    WorkloadOpt,
    check_rate_scale,
    check_scenario,
    check_seed,
    fleet_spec,
    real,
    sim_config,
    whole,
    write_json,
)


def simulate(
    workload: Annotated[str | None, typer.Option("--workload", metavar="PATH", help=WORKLOAD_HELP)] = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            metavar="NAME",
            help=f"{POLICY_HELP}; repeat to compare several (a scenario's default: fleetmind+tokenpilot, "
            "local-only, global-least-load)",
        ),
    ] = None,
    scenario: ScenarioOpt = None,
    fleet: FleetOpt = DEFAULT_FLEET,
    profiles: ProfilesOpt = None,
    rate_scale: RateScaleOpt = 1.0,
    seed: SeedOpt = 0,
    heartbeat: HeartbeatOpt = 0.25,
    signal_delay: SignalDelayOpt = 0.02,
    jitter_arrivals: JitterOpt = 0.0,
    retry_share: RetryShareOpt = 0.5,
    output_budget: OutputBudgetOpt = None,
    deciders: DecidersOpt = 1,
    log_delay: DecisionLogDelayOpt = 0.005,
    split: DeciderSplitOpt = "affinity",
    json_out: JsonOpt = None,
    policy_config: PolicyConfigOpt = None,
    planner: PlannerOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress bar")] = False,
) -> None:
    """Compare routing policies on a trace, or on a multi-DC scenario, in simulation.

    \b
    Example:
      tokenfleet simulate --workload synthetic:duration_s=60 --policy least-tokens --policy tokenpilot
    """
    from rich.console import Console

    from sim.evaluation.compare import compare
    from sim.evaluation.report import TABLE_WIDTH, comparison, progress_bar
    from sim.workloads.sources import open_workload

    config = sim_config(seed, heartbeat, signal_delay, retry_share, output_budget, deciders, log_delay, split)
    check_scenario(scenario, workload, profiles)
    if scenario is not None:
        _simulate_scenario(scenario, policy, config, rate_scale, policy_config, json_out)
        return
    if workload is None:
        raise typer.BadParameter("give --workload (or --scenario)", param_hint="'--workload'")
    if not policy:
        raise typer.BadParameter("give at least one --policy", param_hint="'--policy'")
    params = checked_policies(policy, seed, policy_config)
    planners = checked_planners(planner)
    spec = fleet_spec(fleet, profiles)
    trace = open_workload(workload, seed=seed).jittered(jitter_arrivals, seed)
    if quiet:
        document, timings = compare(trace, spec, policy, config, rate_scale, None, params, planners)
    else:
        with progress_bar() as progress:
            document, timings = compare(trace, spec, policy, config, rate_scale, progress, params, planners)
    Console(width=TABLE_WIDTH, highlight=False).print(comparison(document))
    for timing in timings:
        rate = timing.requests / timing.wall_s if timing.wall_s > 0 else float("inf")
        wall = f"{timing.wall_s:.2f} s wall, {rate:,.0f} simulated requests/s"
        print(f"  {timing.policy}: {wall}", file=sys.stderr)
    write_json(json_out, document)


def _simulate_scenario(
    name: str, policies: list[str] | None, config: Any, scale: float, stages: Path | None, out: str | None
) -> None:
    """``simulate --scenario``: the scenario's fleet and workload, its default policies unless
    given; ``stages``: the policy config file."""
    from sim.evaluation.scenario import DEFAULT_POLICIES, format_scenario, run_scenario
    from sim.scenarios import load_scenario

    chosen = list(policies or DEFAULT_POLICIES)
    params = checked_policies(chosen, config.seed, stages)
    loaded = load_scenario(name, seed=config.seed)
    document = run_scenario(loaded, chosen, config, scale, params)
    print(format_scenario(document))
    write_json(out, document)


def capacity(
    workload: Annotated[str | None, typer.Option("--workload", metavar="PATH", help=WORKLOAD_HELP)] = None,
    scenario: ScenarioOpt = None,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            metavar="NAME",
            help=f"{POLICY_HELP}; repeat: the first is judged, the rest compared at the best one's capacity",
        ),
    ] = None,
    fleet: FleetOpt = DEFAULT_FLEET,
    seed: SeedOpt = 0,
    heartbeat: HeartbeatOpt = 0.25,
    signal_delay: SignalDelayOpt = 0.02,
    jitter_arrivals: JitterOpt = 0.0,
    retry_share: RetryShareOpt = 0.5,
    output_budget: OutputBudgetOpt = None,
    start: Annotated[
        float, typer.Option("--start", metavar="X", help="first rate scale probed", callback=check_rate_scale)
    ] = 1.0,
    precision: Annotated[
        float,
        typer.Option(
            "--precision",
            metavar="P",
            help="stop when the bracket is within 1+P, P in [0.001, 1]",
            callback=real(0.001, 1.0, low_open=False),
        ),
    ] = 0.02,
    jobs: Annotated[
        int,
        typer.Option("--jobs", metavar="N", help="policies searched in parallel", callback=whole(1, 64)),
    ] = 1,
    deciders: DecidersOpt = 1,
    log_delay: DecisionLogDelayOpt = 0.005,
    split: DeciderSplitOpt = "affinity",
    json_out: JsonOpt = None,
    policy_config: PolicyConfigOpt = None,
) -> None:
    """SLO capacity: per policy, the highest rate scale keeping 99 % of interactive requests
    within their TTFT and TPOT objective (bisection to --precision).

    \b
    Example:
      tokenfleet capacity --workload synthetic:duration_s=60 --fleet 2xllama3-8b-h100 --policy tokenpilot
    """
    from sim.engine.fleet import parse_fleet
    from sim.evaluation.capacity import capacities, format_capacity
    from sim.workloads.sources import open_workload

    if scenario is None and workload is None:
        raise typer.BadParameter("give --workload (or --scenario)", param_hint="'--workload'")
    if scenario is None and not policy:
        raise typer.BadParameter("give at least one --policy", param_hint="'--policy'")
    check_scenario(scenario, workload)
    if not policy:
        from sim.evaluation.scenario import DEFAULT_POLICIES

        policy = list(DEFAULT_POLICIES)
    no_bounds(policy)
    params = checked_policies(policy, seed, policy_config)
    config = sim_config(seed, heartbeat, signal_delay, retry_share, output_budget, deciders, log_delay, split)
    if scenario is not None:
        from sim.scenarios import load_scenario

        loaded = load_scenario(scenario, seed=seed)
        spec, base = loaded.fleet, loaded.workload
    else:
        assert workload is not None
        spec, base = parse_fleet(fleet), open_workload(workload, seed=seed)
    trace = base.jittered(jitter_arrivals, seed)
    document = capacities(trace, spec, policy, config, start, precision, params, jobs)
    print(format_capacity(document))
    write_json(json_out, document)


def tail(
    workload: WorkloadOpt,
    policy: Annotated[
        list[str], typer.Option("--policy", metavar="NAME", help=f"{POLICY_HELP}; repeat to analyse several")
    ],
    fleet: FleetOpt = DEFAULT_FLEET,
    rate_scale: RateScaleOpt = 1.0,
    seed: SeedOpt = 0,
    heartbeat: HeartbeatOpt = 0.25,
    signal_delay: SignalDelayOpt = 0.02,
    jitter_arrivals: JitterOpt = 0.0,
    retry_share: RetryShareOpt = 0.5,
    output_budget: OutputBudgetOpt = None,
    json_out: JsonOpt = None,
    policy_config: PolicyConfigOpt = None,
) -> None:
    """Where a policy's TTFT tail comes from, against the ideal floor: the prompt cache lost to
    the fleet's capacity (held by no instance) or to routing (held by another), and its cost.

    \b
    Example:
      tokenfleet tail --workload synthetic:duration_s=60 --fleet 2xllama3-8b-h100 --policy tokenpilot
    """
    from sim.engine.fleet import parse_fleet
    from sim.evaluation.tail import analyse, format_tail, to_json
    from sim.workloads.sources import open_workload

    no_bounds(policy)
    params = checked_policies(policy, seed, policy_config)
    config = sim_config(seed, heartbeat, signal_delay, retry_share, output_budget)
    spec = parse_fleet(fleet)
    trace = open_workload(workload, seed=seed).jittered(jitter_arrivals, seed).scaled(rate_scale)
    tails = [analyse(trace, spec, name, config, params) for name in policy]
    print("\n".join(format_tail(t) for t in tails))
    if json_out:
        document = {"workload": trace.name, "rate_scale": rate_scale, "tails": [to_json(t) for t in tails]}
        write_json(json_out, document)


def report(
    result: Annotated[
        Path, typer.Argument(metavar="RESULT.json", help="a simulate, capacity or scoreboard JSON")
    ],
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="where the PNG files go")] = Path(
        "out/report"
    ),
) -> None:
    """Draw a result as PNG: TTFT CDFs and goodput per class (simulate), compliance against rate
    scale (capacity).

    \b
    Example:
      tokenfleet simulate --workload synthetic:duration_s=60 --policy tokenpilot --json out/r.json
      tokenfleet report out/r.json --out out/report
    """
    from sim.evaluation.plots import NotAResult, draw

    try:
        document = json.loads(result.read_text())
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"cannot read {result}: {exc}", param_hint="RESULT.json") from None
    try:
        written = draw(document, out) if isinstance(document, dict) else []
    except (NotAResult, KeyError, TypeError) as exc:
        raise typer.BadParameter(f"{result}: {exc}", param_hint="RESULT.json") from None
    if not written:
        raise typer.BadParameter(f"{result}: not a result document", param_hint="RESULT.json")
    for path in written:
        print(f"wrote {path}")


def generate(
    out: Annotated[str, typer.Option("--out", metavar="FILE")],
    duration: Annotated[
        float,
        typer.Option("--duration", metavar="S", help="seconds of traffic", callback=real(0.0, MAX_SECONDS)),
    ] = 600.0,
    rate: Annotated[
        float,
        typer.Option("--rate", metavar="R", help="mean requests per second", callback=real(0.0, 1e5)),
    ] = 4.0,
    seed: Annotated[int, typer.Option("--seed", metavar="N", callback=check_seed)] = 0,
) -> None:
    """Write a synthetic multi-tenant workload (Mooncake JSONL).

    \b
    Example:
      tokenfleet generate --out out/synthetic.jsonl --duration 600 --rate 4
    """
    from sim.workloads.synthetic import SyntheticMix, write_jsonl

    mix = SyntheticMix(duration_s=duration, rate_per_s=rate, seed=seed)
    count = write_jsonl(mix.generate(), Path(out))
    print(f"wrote {count} requests to {out}")
