"""What a fleet file says of the fleet's shape: GPU budgets, staged weights, load times, floors.

Read from the same YAML document as the rules (``agents/policy/fleetmind/rules.py``)::

    data_centres:
      - name: A
        gpus: 32                 # the DC's GPU budget (default: the GPUs of the instances listed)
        warm_capacity: 2         # how many models' weights it can keep staged (default 0)
        warm_models: [llama3-8b] # staged at the start (at most warm_capacity)
    models:
      llama3-8b:
        load_s: {cold: 180, warm: 30}   # start -> ready; warm where the DC has the weights staged
        min_replicas: 1                  # the fleet never goes below (default 0)

A model without ``load_s`` loads in ``DEFAULT_LOAD_S`` (cold and warm alike).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_LOAD_S = 60.0
"""Start -> ready of a model whose fleet file gives no ``load_s``."""


@dataclass(frozen=True, slots=True)
class DcBudget:
    """One DC's ``gpus`` budget (None: the GPUs of the instances the file lists there), its
    ``warm_capacity`` and the models staged at the start (``warm_models``)."""

    gpus: int | None = None
    warm_capacity: int = 0
    warm_models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelLoad:
    """How long a replica of the model takes from start to ready, cold and warm, and its floor."""

    cold_s: float = DEFAULT_LOAD_S
    warm_s: float = DEFAULT_LOAD_S
    min_replicas: int = 0


@dataclass(frozen=True, slots=True)
class FleetShape:
    dcs: Mapping[str, DcBudget] = field(default_factory=dict)
    models: Mapping[str, ModelLoad] = field(default_factory=dict)

    def dc(self, name: str) -> DcBudget:
        return self.dcs.get(name, DcBudget())

    def model(self, name: str) -> ModelLoad:
        return self.models.get(name, ModelLoad())


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"{what} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {value!r}")
    return value


def parse_shape(doc: Mapping[str, Any]) -> FleetShape:
    """The shape keys of a fleet document (module docstring); ``ValueError`` naming the key."""
    dcs: dict[str, DcBudget] = {}
    for dc in doc.get("data_centres") or []:
        name = str(dc["name"])
        gpus = None if dc.get("gpus") is None else _count(dc["gpus"], f"data centre {name!r}: gpus")
        capacity = _count(dc.get("warm_capacity", 0), f"data centre {name!r}: warm_capacity")
        warm = dc.get("warm_models") or []
        if not isinstance(warm, list) or not all(isinstance(m, str) for m in warm):
            raise ValueError(f"data centre {name!r}: warm_models must be a list of model names")
        if len(warm) > capacity:
            raise ValueError(f"data centre {name!r}: {len(warm)} warm_models but warm_capacity {capacity}")
        dcs[name] = DcBudget(gpus, capacity, tuple(warm))
    models: dict[str, ModelLoad] = {}
    for name, entry in (doc.get("models") or {}).items():
        if not isinstance(entry, Mapping):
            continue
        load = entry.get("load_s") or {}
        if not isinstance(load, Mapping):
            raise ValueError(f"model {name!r}: load_s must be a mapping {{cold: S, warm: S}}")
        cold = _seconds(load.get("cold", DEFAULT_LOAD_S), f"model {name!r}: load_s.cold")
        warm = _seconds(load.get("warm", cold), f"model {name!r}: load_s.warm")
        if warm > cold:
            raise ValueError(f"model {name!r}: load_s.warm ({warm:g}) is longer than load_s.cold ({cold:g})")
        floor = _count(entry.get("min_replicas", 0), f"model {name!r}: min_replicas")
        models[str(name)] = ModelLoad(cold, warm, floor)
    return FleetShape(dcs, models)
