"""Planners: the fleet's shape over minutes (``contract.py``), chosen per run by name.

- ``static``: the fleet as the fleet file lists it, never changed;
- ``hpa``: the Kubernetes HorizontalPodAutoscaler on vLLM's per-replica metric (``hpa.py``);
- ``dynamo-sla``: Dynamo's SLA planner (``dynamo_sla.py``);
- ``fleetmind``: FleetMind's planner (``agents/policy/fleetmind/planner.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, TypeVar

from agents.policy.fleetmind.rules import FleetRules
from agents.policy.planners.contract import FleetState, Plan, Planner
from agents.policy.planners.dynamo_sla import DynamoProfile


class StaticPlanner:
    """Never changes the fleet: every pool keeps the size the fleet file gives it."""

    name = "static"
    interval_s = math.inf

    def plan(self, state: FleetState) -> Plan:
        """An empty plan: nothing to converge to."""
        return Plan()


PLANNERS = ("static", "hpa", "dynamo-sla", "fleetmind")


def check_planner(name: str) -> None:
    """``ValueError`` naming the known planners if ``name`` is not one."""
    if name not in PLANNERS:
        raise ValueError(f"unknown planner {name!r}; known: {', '.join(PLANNERS)}")


def build_planner(
    name: str,
    rules: FleetRules | None = None,
    profiles: Mapping[tuple[str, str], DynamoProfile] | None = None,
    params: Mapping[str, str] | None = None,
) -> Planner:
    """A fresh planner ``name``: ``rules`` are the fleet's (FleetMind's regions, failure
    domains, reservations), ``profiles`` what Dynamo's profiling step measured per ``(model,
    version)`` (``dynamo-sla`` needs them), ``params`` fields of the planner's parameters
    (``HpaParams``, ``DynamoSlaParams``, ``PlannerParams``) as text, the rest their defaults.
    ``ValueError`` for an unknown name, an unknown parameter or a bad value."""
    check_planner(name)
    given = dict(params or {})
    if name == "static":
        if given:
            raise ValueError("the static planner has no parameters")
        return StaticPlanner()
    if name == "hpa":
        from agents.policy.planners.hpa import HpaParams, HpaPlanner

        return HpaPlanner(_params(HpaParams, given))
    if name == "dynamo-sla":
        from agents.policy.planners.dynamo_sla import DynamoSlaParams, DynamoSlaPlanner

        if profiles is None:
            raise ValueError("dynamo-sla needs the engines' profiles (its profiling step)")
        return DynamoSlaPlanner(profiles, _params(DynamoSlaParams, given))
    from agents.policy.fleetmind.planner import FleetMindPlanner, PlannerParams  # imports this package

    return FleetMindPlanner(rules, _params(PlannerParams, given))


P = TypeVar("P")


def _params(kind: type[P], given: Mapping[str, str]) -> P:
    """``kind`` (a dataclass of numbers and words) with the ``given`` fields read from text."""
    fields = {f.name: f for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, text in given.items():
        if key not in fields:
            raise ValueError(f"unknown planner parameter {key!r}; known: {', '.join(fields)}")
        default = fields[key].default
        try:
            if isinstance(default, int | float):
                values[key] = type(default)(text)
            elif default is None:  # an optional number (None: off)
                values[key] = float(text)
            else:
                values[key] = text
        except ValueError:
            kind_name = "number" if default is None else type(default).__name__
            raise ValueError(f"planner parameter {key}: {text!r} is not a {kind_name}") from None
    return kind(**values)


__all__ = ["PLANNERS", "FleetState", "Plan", "Planner", "StaticPlanner", "build_planner", "check_planner"]
