"""The planner of a simulated run, by name (``agents/policy/planners``), built for its fleet."""

from __future__ import annotations

from agents.policy.planners import Planner, build_planner, check_planner
from agents.policy.planners.contract import planned_objective
from sim.engine.fleet import FleetSpec
from sim.engine.profiling import profiles_for_fleet
from sim.loop.config import SimConfig


def planner_for(name: str, fleet: FleetSpec, config: SimConfig) -> Planner:
    """A fresh planner ``name`` for ``fleet``; ``dynamo-sla`` with its profiling step run on the
    fleet's engine profiles at the interactive objective. ``ValueError`` naming the known ones."""
    check_planner(name)
    profiles = None
    if name == "dynamo-sla":
        profiles = profiles_for_fleet(fleet, *planned_objective(config.slo_classes))
    return build_planner(name, fleet.rules, profiles)
