"""Which policies and planners a run compares: their names and parameters checked before any
trace is read or policy run (one line and exit status 2 for a bad one)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

PlannerOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--planner",
        metavar="NAME",
        help="who shapes the fleet over time: static (the fleet as listed, the default), hpa, "
        "dynamo-sla or fleetmind; repeat to compare (results keyed POLICY@PLANNER)",
    ),
]


def no_bounds(policies: Sequence[str]) -> None:
    """``ideal`` and ``ideal-fleet-cache`` are latency floors ``simulate`` reports, not policies."""
    from sim.evaluation.compare import BOUNDS

    bounds = [name for name in policies if name in BOUNDS]
    if bounds:
        names = ", ".join(bounds)
        raise typer.BadParameter(f"{names} is a latency bound, not a policy", param_hint="--policy")


def checked_policies(policies: Sequence[str], seed: int, policy_config: Path | None) -> Any:
    """The stage parameters, once every policy name and parameter was checked (before any trace
    is read or policy run)."""
    from agents.policy import PolicyError, build_scheduler
    from agents.policy.registry import params_for
    from sim.evaluation.compare import BOUNDS, check_policies

    params = load_policy_config(policy_config) if policy_config is not None else None
    try:
        check_policies(policies, params)
    except PolicyError as exc:
        raise PolicyError(f"{exc}; bounds: {', '.join(BOUNDS)}") from None
    for name in policies:
        if name not in BOUNDS:
            build_scheduler(name, seed=seed, params=params_for(name, params))
    return params


def checked_planners(planners: Sequence[str] | None) -> tuple[str, ...]:
    """The planners to compare (default: ``static``), each a known name, none twice;
    ``typer.BadParameter`` naming the known ones otherwise."""
    from agents.policy.planners import check_planner

    names = tuple(planners or ("static",))
    try:
        for name in names:
            check_planner(name)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--planner'") from None
    if len(set(names)) < len(names):
        raise typer.BadParameter("a planner is named twice", param_hint="'--planner'")
    return names


def load_policy_config(path: Path) -> dict[str, dict[str, Any]]:
    """Stage parameters from a YAML file (stage name -> keyword parameters); ValueError with
    one line saying what is wrong if the file is missing, not YAML or not that shape."""
    from infra.files import read_yaml

    data = read_yaml(path, "policy config")
    shape = "must map stage names to parameter mappings, e.g. 'tokenpilot: {tie_tolerance: 0.05}'"
    if not isinstance(data, dict):
        raise ValueError(f"policy config {str(path)!r} {shape}")
    for stage, kwargs in data.items():
        if (
            not isinstance(stage, str)
            or not isinstance(kwargs, dict)
            or not all(isinstance(k, str) for k in kwargs)
        ):
            raise ValueError(f"policy config {str(path)!r}: stage {stage!r} {shape}")
    return data
