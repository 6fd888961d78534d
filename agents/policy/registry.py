"""Policies by name: a policy is its stages joined with ``+``, built from a config mapping.

    tokenpilot                          = pass-through + home-dc + tokenpilot
    pass-through+home-dc+least-tokens   (every stage named)
    slomax+tokenpilot                   (SLOMax admission in front of TokenPilot)
    slomax+fleetmind+tokenpilot         (FleetMind picks the DC, its TokenPilot the instance)
    local-only                          = pass-through + local-only + tokenpilot

A name lists at most one stage of each kind, in pipeline order (admission, DC selection,
instance selection); the instance-selection stage is required, the others default to
``pass-through`` and ``home-dc``, and a name with a DC-selection stage but no router gets
``tokenpilot`` (FleetMind picks the DC, that DC's TokenPilot the instance). Stage parameters
come from a mapping (YAML, or the settings object): ``{"tokenpilot": {"tie_tolerance": 0.05}}``;
every stage also gets the seed.
Unknown stages and parameters are errors that list what is known. The simulator's ``ideal``
bounds are not policies and are not here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from agents.policy.baselines import LeastRequest, LeastTokens, RandomChoice, RoundRobin
from agents.policy.defaults import HomeDc, PassThrough
from agents.policy.fleetmind import FleetMind, GlobalLeastLoad, LocalOnly
from agents.policy.peers import (
    DynamoDisagg,
    DynamoKv,
    LlmdDefault,
    LlmdDefault4k,
    LlmdLoadAware,
    LlmdPd,
    LlmdPrecise,
    SglangCacheAware,
    SglangGatewayCacheAware,
    SmgEvents,
)
from agents.policy.pipeline import Scheduler
from agents.policy.pools import HoldLimits
from agents.policy.slomax import SloMax
from agents.policy.tokenpilot import TokenPilot

StageParams = Mapping[str, Mapping[str, Any]]
"""stage name -> keyword arguments of its constructor."""

ADMISSION: dict[str, Callable[..., Any]] = {"pass-through": PassThrough, "slomax": SloMax}
DC_SELECTION: dict[str, Callable[..., Any]] = {
    "home-dc": HomeDc,
    "fleetmind": FleetMind,
    "local-only": LocalOnly,
    "global-least-load": GlobalLeastLoad,
}
INSTANCE_SELECTION: dict[str, Callable[..., Any]] = {
    cls.name: cls
    for cls in (
        RoundRobin,
        RandomChoice,
        LeastRequest,
        LeastTokens,
        SglangCacheAware,
        SglangGatewayCacheAware,
        SmgEvents,
        DynamoKv,
        LlmdDefault,
        LlmdDefault4k,
        LlmdLoadAware,
        LlmdPrecise,
        TokenPilot,
        LlmdPd,
        DynamoDisagg,
    )
}
DC_DEFAULT_ROUTER = "tokenpilot"
"""The instance selection of a policy that names a DC-selection stage and no router."""
_KINDS = (
    ("admission", ADMISSION),
    ("DC selection", DC_SELECTION),
    ("instance selection", INSTANCE_SELECTION),
)


class PolicyError(ValueError):
    """A policy name or its parameters do not describe a scheduler we can build."""


def policy_names() -> list[str]:
    """The routers a user can name alone (each composes with the default stages)."""
    return list(INSTANCE_SELECTION)


def known_stages() -> str:
    """Every registered stage by kind, for error messages and ``--help``."""
    return "; ".join(f"{kind}: {', '.join(sorted(table))}" for kind, table in _KINDS)


def parse_policy(name: str) -> tuple[str, str, str]:
    """(admission, DC selection, instance selection) stage names of ``name``; PolicyError if
    a part is unknown, repeated, out of pipeline order, or no instance selection is named."""
    chosen: list[str | None] = [None, None, None]
    last_kind = -1
    for part in (p.strip() for p in name.split("+")):
        kind = next((k for k, (_, table) in enumerate(_KINDS) if part in table), None)
        if kind is None:
            raise PolicyError(f"unknown stage {part!r} in policy {name!r}; known stages: {known_stages()}")
        if kind <= last_kind:
            raise PolicyError(
                f"policy {name!r}: stages must be named once each, in the order admission + "
                "DC selection + instance selection"
            )
        chosen[kind], last_kind = part, kind
    if chosen[2] is None and chosen[1] is not None:
        chosen[2] = DC_DEFAULT_ROUTER  # a DC choice alone: each DC's TokenPilot picks the instance
    if chosen[2] is None:
        raise PolicyError(f"policy {name!r} names no instance-selection stage; known: {known_stages()}")
    return chosen[0] or "pass-through", chosen[1] or "home-dc", chosen[2]


def build_scheduler(
    name: str, seed: int = 0, params: StageParams | None = None, hold: HoldLimits | None = None
) -> Scheduler:
    """A fresh ``Scheduler`` for policy ``name`` (see the module docstring), holding requests
    within ``hold``."""
    stages = parse_policy(name)
    params = dict(params or {})
    unused = sorted(set(params) - set(stages))
    if unused:
        raise PolicyError(f"parameters for {', '.join(unused)}, which policy {name!r} does not use")
    built = [
        _build(stage, table[stage], seed, params.get(stage, {}))
        for stage, (_, table) in zip(stages, _KINDS, strict=True)
    ]
    admission, dc_selection, instance_selection = built
    return Scheduler(name, admission, dc_selection, instance_selection, hold=hold)


def with_deployment(
    name: str, params: StageParams | None, heartbeat_s: float, rules: object | None = None
) -> dict[str, dict[str, Any]]:
    """``params`` plus what the DC-selection stages of policy ``name`` learn from the deployment
    rather than from the user: the heartbeat interval (``fleetmind``, ``global-least-load``: an
    instance silent for two intervals is out) and the fleet's ``rules`` (``fleetmind``; None =
    none given). Parameters given explicitly win. The simulator and the worker both use it."""
    stages = parse_policy(name)
    merged = {stage: dict(kwargs) for stage, kwargs in (params or {}).items()}
    fleetmind: dict[str, Any] = {"heartbeat_s": heartbeat_s}
    if rules is not None:
        fleetmind["rules"] = rules
    for stage, derived in (("fleetmind", fleetmind), ("global-least-load", {"heartbeat_s": heartbeat_s})):
        if stage in stages:
            merged[stage] = {**derived, **merged.get(stage, {})}
    return merged


def params_for(name: str, params: StageParams | None) -> dict[str, Mapping[str, Any]]:
    """The part of ``params`` for the stages of policy ``name`` (several policies compared side
    by side share one configuration; each takes what concerns its own stages)."""
    stages = parse_policy(name)
    return {stage: kwargs for stage, kwargs in (params or {}).items() if stage in stages}


def _build(stage: str, factory: Callable[..., Any], seed: int, kwargs: Mapping[str, Any]) -> Any:
    accepted = set(inspect.signature(factory).parameters) - {"seed"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise PolicyError(
            f"unknown parameter {', '.join(unknown)} for stage {stage!r}; "
            f"known: {', '.join(sorted(accepted)) or 'none'}"
        )
    return factory(seed=seed, **kwargs)
