"""What a planner sees and what it decides: FleetMind's second timescale, and its peers'.

A planner is asked every ``interval_s`` seconds for the fleet's shape: how many replicas of each
model version should run in each data centre, and which models' weights each data centre keeps
staged (warm). It decides on a ``FleetState``: the fleet as its heartbeats show it (replicas
ready, loading and draining per pool, their queues and KV use), each data centre's GPU budget
and staged weights, the models it may place (GPUs per replica, load times, floors), and the
demand since the last plan (``DemandSample``: first arrivals per model version and home DC,
whatever admission did with them, and the completions' token counts).

The driver (the simulator's runner, the ``tokenfleet planner`` service) acts on a ``Plan``:

- ``replicas[(model, version, dc)] = n``: converge that pool to ``n`` replicas (ready + loading).
  More: start replicas while the DC's GPU budget has room (each holds its GPUs from its start);
  fewer: cancel loading ones first, then drain ready ones (a draining replica gets nothing new,
  finishes what it runs, then frees its GPUs). A pool the plan does not name keeps its size.
- ``prefill[(model, version, dc)] = n``: of that pool's replicas, ``n`` run prefill only (role
  ``prefill``: the prefill legs of disaggregated requests, their KV cache moved over the DC's
  link), the rest ``both``. Starts take the role the pool lacks, a pool above its share of one
  role drains that role first. A pool the plan does not name has none.
- ``warm[dc] = (model, ...)``: the models whose weights ``dc`` should keep staged, at most its
  ``warm_capacity``; staging takes the model's cold load time and no GPUs, and a model not
  listed is evicted to make room. ``None``: the staged set stays as it is.
- ``reasons[(model, version, dc)]``: why, in words with the figures (published with the plan).

Planners are pure (no clock, no I/O): the same states give the same plans.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agents.policy.common.slo import SloClass

PoolKey = tuple[str, str, str]
"""``(model, version, dc)``: one deployment of a model version in a data centre."""

PLANNED_TTFT_S, PLANNED_TPOT_S = 2.0, 0.1
"""The objective a fleet is planned for where the interactive class sets none."""


def planned_objective(slo_classes: Mapping[str, SloClass]) -> tuple[float, float]:
    """The TTFT and TPOT (seconds) a fleet is planned for: the interactive class's, else
    ``PLANNED_TTFT_S`` / ``PLANNED_TPOT_S``."""
    slo = slo_classes.get("interactive")
    if slo is None:
        return PLANNED_TTFT_S, PLANNED_TPOT_S
    return slo.ttft_s or PLANNED_TTFT_S, slo.tpot_s or PLANNED_TPOT_S


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model version the planner may place: ``gpus`` per replica, ``load_cold_s`` /
    ``load_warm_s`` from start to ready (warm: the DC has its weights staged), at least
    ``min_replicas`` replicas in the whole fleet, ``kv_tokens`` one replica's KV cache,
    ``kv_bytes_per_token`` what a prefill/decode transfer moves per prompt token (0: unknown)."""

    model: str
    version: str
    gpus: int
    load_cold_s: float
    load_warm_s: float
    min_replicas: int = 0
    kv_tokens: int = 0
    kv_bytes_per_token: int = 0


@dataclass(frozen=True, slots=True)
class DcState:
    """One data centre: its ``region`` and ``failure_domain``, its GPU budget ``gpus`` and the
    GPUs its replicas hold now (``gpus_used``: loading, ready and draining), how many models'
    weights it can keep staged (``warm_capacity``), which are staged (``warm``) and which are
    being staged (``staging``); ``kv_link_gbps`` its link for moving KV caches (0: none, no
    replica there may run prefill only)."""

    name: str
    region: str
    failure_domain: str
    gpus: int
    gpus_used: int
    warm_capacity: int = 0
    warm: tuple[str, ...] = ()
    staging: tuple[str, ...] = ()
    kv_link_gbps: float = 0.0


@dataclass(frozen=True, slots=True)
class PoolState:
    """One pool as its newest heartbeats show it: replicas ``ready``, ``loading`` and
    ``draining``; over its ready replicas the requests ``waiting`` and ``running`` (sums), the
    ``tokens_in_flight`` (sum) and the KV-cache use ``kv_usage`` (mean of used / total, 0..1).
    Since the last plan, ``completed`` requests ended ok on its replicas, with a mean TPOT of
    ``tpot_s`` (None: none with two tokens or more)."""

    model: str
    version: str
    dc: str
    ready: int
    loading: int = 0
    draining: int = 0
    waiting: int = 0
    running: int = 0
    tokens_in_flight: int = 0
    kv_usage: float = 0.0
    completed: int = 0
    tpot_s: float | None = None

    @property
    def key(self) -> PoolKey:
        return (self.model, self.version, self.dc)

    @property
    def replicas(self) -> int:
        """Replicas that count towards the pool's size: ready and loading (not draining)."""
        return self.ready + self.loading


@dataclass(slots=True)
class DemandSample:
    """Demand for ``model`` at ``version`` from home DC ``home_dc`` over ``[start_s, end_s)``:
    ``arrivals`` first attempts (retries are not new demand) with ``input_tokens`` prompt tokens
    and ``output_budget`` tokens allowed; of them admission ``held`` (queued at least once) and
    ``rejected``. ``completed`` attempts ended in the interval (finished, timed out or failed;
    not rejected), with ``output_tokens`` and ``completed_input_tokens``, ``cached_tokens`` of
    which their instance had in its prefix cache; ``met_slo`` of them finished within their
    objective, with ``met_input_tokens`` prompt tokens."""

    model: str
    version: str
    home_dc: str
    start_s: float
    end_s: float
    arrivals: int = 0
    input_tokens: int = 0
    output_budget: int = 0
    held: int = 0
    rejected: int = 0
    completed: int = 0
    met_slo: int = 0
    output_tokens: int = 0
    completed_input_tokens: int = 0
    cached_tokens: int = 0
    met_input_tokens: int = 0

    @property
    def rate_per_s(self) -> float:
        """Arrivals per second over the interval."""
        span = self.end_s - self.start_s
        return self.arrivals / span if span > 0 else 0.0


@dataclass(frozen=True, slots=True)
class FleetState:
    """Everything a planner decides on at ``now_s`` (module docstring). ``slo_ttft_s`` /
    ``slo_tpot_s``: the interactive objective the fleet is planned for."""

    now_s: float
    models: tuple[ModelSpec, ...]
    dcs: tuple[DcState, ...]
    pools: tuple[PoolState, ...]
    demand: tuple[DemandSample, ...]
    slo_ttft_s: float = PLANNED_TTFT_S
    slo_tpot_s: float = PLANNED_TPOT_S

    def pool(self, model: str, version: str, dc: str) -> PoolState:
        """The pool's state (an empty one if it has no replica)."""
        for pool in self.pools:
            if pool.key == (model, version, dc):
                return pool
        return PoolState(model, version, dc, 0)

    def model_spec(self, model: str, version: str) -> ModelSpec | None:
        for spec in self.models:
            if (spec.model, spec.version) == (model, version):
                return spec
        return None


@dataclass(frozen=True, slots=True)
class Plan:
    """What the driver converges to (module docstring)."""

    replicas: Mapping[PoolKey, int] = field(default_factory=dict)
    warm: Mapping[str, tuple[str, ...]] | None = None
    reasons: Mapping[PoolKey, str] = field(default_factory=dict)
    prefill: Mapping[PoolKey, int] = field(default_factory=dict)


class Planner(Protocol):
    """Decides the fleet's shape every ``interval_s`` seconds (module docstring)."""

    name: str
    interval_s: float

    def plan(self, state: FleetState) -> Plan:
        """The desired shape now; pure in ``state`` and the planner's own history."""
        ...
