"""The fleet's shape in the simulator: replicas that start, load, serve, drain and stop.

Rows. The view's rows are fixed for a run: the instances the fleet file lists, then, with a
planner that may change the fleet, one *slot* per replica each DC could host of each model,
``floor(gpu_budget(dc) / gpus(model))`` per pair less the ones listed there. A slot is ``off``,
``loading``, ``ready`` or ``draining``; only ``ready`` rows are ready in the scheduler's view.

Transitions::

    off --start--> loading --(load time)--> ready --drain--> draining --(idle, grace)--> off
    loading --cancel--> off

- start: only while the DC's GPU budget has room: ``Σ gpus of its slots not off + gpus(model) ≤
  gpu_budget(dc)``; the replica holds (and costs) its GPUs from that moment, and loads for the
  model's ``load_s.warm`` where the DC has its weights staged, else ``load_s.cold``; it starts
  with an empty cache.
- drain: it gets nothing new (not ready in the next heartbeat); what reaches it, it still runs.
  It stops once it runs nothing and ``grace_s`` has passed since the drain began (two heartbeat
  intervals, the signal's delay and the longest one-way trip: no decision taken on a snapshot
  that still showed it ready can reach it later). An attempt that reaches a replica after it
  stopped fails and counts in ``lost_in_scale_down``.
- a plan (``Plan.replicas``): a pool above its target cancels loading replicas first (newest
  first), then drains the ready ones with the fewest tokens in flight; below it, starts
  replicas while the budget has room. Convergence runs at every plan and whenever a stop frees
  GPUs.
- roles (``Plan.prefill``): of a pool's target, the ``prefill`` replicas (only where its DC has
  a KV link) and the rest ``both`` are two targets; each is converged as above, a start takes
  the role its target lacks (a slot's role is set when it starts), a pool the plan does not
  name in ``prefill`` keeps the prefill replicas it runs.
- warm weights (``Plan.warm``): a DC stages a model in its cold load time without GPUs; when
  ``warm_capacity`` is full, a staged model the plan no longer lists is evicted first.

Figures (``figures``): ``gpu_hours`` (GPUs held, inside the measurement window W),
``replica_starts``, ``cold_starts``, ``warm_starts``, ``lost_in_scale_down``, ``time_to_ready_s``
(start to ready, p50 and p95) and a ``timeline`` of desired, loading, ready and draining
replicas per pool, sampled every ``timeline_step_s``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from agents.policy.planners.contract import (
    DcState,
    DemandSample,
    FleetState,
    ModelSpec,
    Plan,
    PoolKey,
    PoolState,
)
from agents.policy.types import ROLE_BOTH, ROLE_PREFILL, BoolArray, ClusterView
from sim.engine.fleet import FleetSpec, InstanceSpec

SlotState = Literal["off", "loading", "ready", "draining"]


@dataclass(slots=True)
class _Start:
    """One replica start: when, whether it loaded warm, when it became ready (nan: never)."""

    start_s: float
    warm: bool
    ready_s: float = math.nan


@dataclass(slots=True)
class _Slot:
    spec: InstanceSpec
    state: SlotState
    since_s: float = 0.0  # when the state began
    held_from_s: float = 0.0  # when its GPUs were taken (off: meaningless)
    start: _Start | None = None  # its latest start (None: listed in the fleet file)


def slot_fleet(fleet: FleetSpec) -> FleetSpec:
    """``fleet`` with a slot row per replica each DC could add of each model (module docstring),
    and each DC's budget written out: a budget the file leaves to "the GPUs listed there" stays
    those of the listed instances, not of the slots added."""
    rows = list(fleet.instances)
    budgets = {dc: fleet.gpu_budget(dc) for dc in fleet.dc_names}
    for dc, budget in budgets.items():
        for model in fleet.models():
            profile = fleet.profile_of(model)
            listed = [s for s in fleet.instances if s.dc == dc and s.model == model]
            version = listed[0].version if listed else _version_of(fleet, model)
            price = listed[0].price_per_hour if listed else "profile"
            for k in range(len(listed), budget // profile.gpus):
                rows.append(InstanceSpec(f"{dc}/{model}/r{k}", dc, model, version, profile, price))
    written = {dc: replace(fleet.shape.dc(dc), gpus=gpus) for dc, gpus in budgets.items()}
    return replace(fleet, instances=tuple(rows), shape=replace(fleet.shape, dcs=written))


def _version_of(fleet: FleetSpec, model: str) -> str:
    """The version a new replica of a model no instance lists runs: the rules' pin, else "1"."""
    return fleet.rules.versions.get(model, "1")


def _role_of(slot: _Slot) -> str:
    """A slot's role as plans count it: ``prefill`` or ``both`` (a listed ``decode`` row)."""
    return ROLE_PREFILL if slot.spec.role == ROLE_PREFILL else ROLE_BOTH


class Replicas:
    """Every row's state, the DCs' staged weights, and the figures (module docstring)."""

    def __init__(
        self,
        fleet: FleetSpec,
        listed: int,
        window: tuple[float, float],
        grace_s: float,
        timeline_step_s: float = 60.0,
    ) -> None:
        """``fleet``: the slot fleet (``slot_fleet``) whose first ``listed`` rows are the fleet
        file's instances, ready from the start."""
        self.fleet = fleet
        self.window = window
        self.grace_s = grace_s
        self.timeline_step_s = timeline_step_s
        start = window[0]
        self.slots = [
            _Slot(spec, "ready" if i < listed else "off", start, start)
            for i, spec in enumerate(fleet.instances)
        ]
        self._pool_rows: dict[PoolKey, list[int]] = defaultdict(list)
        for index, spec in enumerate(fleet.instances):
            self._pool_rows[(spec.model, spec.version, spec.dc)].append(index)
        self.desired: dict[PoolKey, int] = {key: self._size(key) for key in self._pool_rows}
        self.desired_prefill: dict[PoolKey, int] = {
            key: self._size(key, ROLE_PREFILL) for key in self._pool_rows
        }
        self.staged: dict[str, dict[str, float]] = {  # dc -> model -> when staged
            dc: {m: start for m in fleet.shape.dc(dc).warm_models} for dc in fleet.dc_names
        }
        self._held_s = [0.0] * len(self.slots)
        self._ready = np.array([slot.state == "ready" for slot in self.slots], dtype=bool)
        self._on = self._ready.copy()
        self._row_of = {spec.instance_id: i for i, spec in enumerate(fleet.instances)}
        self._ended: dict[PoolKey, list[float]] = defaultdict(lambda: [0, 0.0, 0])  # ok, Σ tpot, n tpot
        self.starts: list[_Start] = []  # every start (cancelled ones too: they held GPUs)
        self.lost_in_scale_down = 0
        self.timeline: list[tuple[float, dict[PoolKey, tuple[int, int, int, int]]]] = []

    # --- what the runner reads ----------------------------------------------------------------

    def ready_mask(self) -> BoolArray:
        """Per row: ready (the scheduler may send it requests)."""
        return self._ready.copy()

    def on_rows(self) -> list[int]:
        """The rows whose replica runs (loading, ready or draining): the ones that heartbeat."""
        return np.flatnonzero(self._on).tolist()

    def specs(self) -> tuple[InstanceSpec, ...]:
        """Every row's instance as it runs now (its role is set when it starts)."""
        return tuple(slot.spec for slot in self.slots)

    def is_on(self, index: int) -> bool:
        return self.slots[index].state != "off"

    def is_draining(self, index: int) -> bool:
        return self.slots[index].state == "draining"

    # --- transitions --------------------------------------------------------------------------

    def apply(self, plan: Plan, now: float) -> None:
        """Adopt ``plan``'s targets and staged weights; ``converge`` acts on them."""
        for key, target in plan.replicas.items():
            if key in self._pool_rows:
                self.desired[key] = max(0, int(target))
        for key, target in plan.prefill.items():
            if key in self._pool_rows and self.fleet.kv_link_gbps.get(key[2], 0.0) > 0:
                self.desired_prefill[key] = max(0, int(target))
        if plan.warm is not None:
            for dc, models in plan.warm.items():
                self._stage(dc, models, now)

    def converge(self, now: float, loads: Sequence[int]) -> tuple[list[tuple[int, float]], list[int]]:
        """Move every pool towards its target: ``(starts, drains)``, each start as ``(row,
        ready_s)``; cancels happen here (module docstring). ``loads``: tokens in flight per row
        (the fewest drain first)."""
        starts: list[tuple[int, float]] = []
        drains: list[int] = []
        for key, rows in self._pool_rows.items():
            for role, target in self._role_targets(key).items():
                excess = self._size(key, role) - target
                if excess > 0:
                    drains += self._shrink(
                        [i for i in rows if _role_of(self.slots[i]) == role], excess, loads, now
                    )
        for key, rows in self._pool_rows.items():
            for role, target in self._role_targets(key).items():
                for _ in range(target - self._size(key, role)):
                    started = self._start(key, rows, now, role)
                    if started is None:
                        break
                    starts.append(started)
        return starts, drains

    def _role_targets(self, key: PoolKey) -> dict[str, int]:
        """The pool's target per role: its prefill replicas (at most its target) and the rest
        ``both``. A fleet file's ``decode`` rows count as ``both`` here: a plan starts none."""
        prefill = min(self.desired_prefill[key], self.desired[key])
        return {ROLE_PREFILL: prefill, ROLE_BOTH: self.desired[key] - prefill}

    def became_ready(self, index: int, now: float) -> None:
        slot = self.slots[index]
        if slot.state == "loading" and slot.start is not None:
            slot.start.ready_s = now
            self._set(index, "ready", now)

    def stop_if_done(self, index: int, idle: bool, now: float) -> bool:
        """A draining row that runs nothing and whose grace has passed stops (True)."""
        slot = self.slots[index]
        if slot.state != "draining" or not idle or now < slot.since_s + self.grace_s:
            return False
        self._turn_off(index, now)
        return True

    def ended_ok(self, instance_id: str, tpot_s: float | None) -> None:
        """A request ended ok on ``instance_id`` (its TPOT, None with one token): the pool's."""
        spec = self.fleet.instances[self._row_of[instance_id]]
        tally = self._ended[(spec.model, spec.version, spec.dc)]
        tally[0] += 1
        if tpot_s is not None:
            tally[1] += tpot_s
            tally[2] += 1

    # --- what planners and figures read -------------------------------------------------------

    def fleet_state(
        self,
        now: float,
        view: ClusterView,
        view_slots: Sequence[int],
        demand: tuple[DemandSample, ...],
        slo: tuple[float, float],
    ) -> FleetState:
        """The fleet as the newest heartbeats show it (``view``, whose row r is row
        ``view_slots[r]`` here), with the budgets and the demand."""
        row_of = {slot: row for row, slot in enumerate(view_slots)}
        pools = []
        ended, self._ended = self._ended, defaultdict(lambda: [0, 0.0, 0])
        for key, rows in self._pool_rows.items():
            ok, tpot_sum, tpots = ended.get(key, (0, 0.0, 0))
            states = [self.slots[i].state for i in rows]
            ready = [i for i in rows if self.slots[i].state == "ready"]
            seen = [row_of[i] for i in ready if i in row_of]
            kv = [view.kv_used[r] / view.kv_total[r] for r in seen if view.kv_total[r]]
            pools.append(
                PoolState(
                    *key,
                    ready=len(ready),
                    loading=states.count("loading"),
                    draining=states.count("draining"),
                    waiting=int(sum(view.waiting[r] for r in seen)),
                    running=int(sum(view.running[r] for r in seen)),
                    tokens_in_flight=int(sum(view.tokens_in_flight[r] for r in seen)),
                    kv_usage=float(np.mean(kv)) if kv else 0.0,
                    completed=int(ok),
                    tpot_s=tpot_sum / tpots if tpots else None,
                )
            )
        return FleetState(now, self._model_specs(), self._dc_states(now), tuple(pools), demand, *slo)

    def _model_specs(self) -> tuple[ModelSpec, ...]:
        specs = {}
        for spec in self.fleet.instances:
            if (spec.model, spec.version) in specs:
                continue
            load = self.fleet.shape.model(spec.model)
            specs[(spec.model, spec.version)] = ModelSpec(
                spec.model,
                spec.version,
                spec.profile.gpus,
                load.cold_s,
                load.warm_s,
                load.min_replicas,
                spec.profile.kv_tokens,
                spec.profile.kv_bytes_per_token,
            )
        return tuple(specs.values())

    def _dc_states(self, now: float) -> tuple[DcState, ...]:
        rules = self.fleet.rules
        states = []
        for dc in self.fleet.dc_names:
            info = rules.dcs.get(dc)
            staged = self.staged[dc]
            states.append(
                DcState(
                    dc,
                    info.region if info else dc,
                    info.failure_domain if info else dc,
                    self.fleet.gpu_budget(dc),
                    self._gpus_used(dc),
                    self.fleet.shape.dc(dc).warm_capacity,
                    tuple(m for m, t in staged.items() if t <= now),
                    tuple(m for m, t in staged.items() if t > now),
                    self.fleet.kv_link_gbps.get(dc, 0.0),
                )
            )
        return tuple(states)

    def sample(self, now: float) -> None:
        """One timeline point: per pool (desired, loading, ready, draining)."""
        point = {}
        for key, rows in self._pool_rows.items():
            states = [self.slots[i].state for i in rows]
            point[key] = (
                self.desired[key],
                states.count("loading"),
                states.count("ready"),
                states.count("draining"),
            )
        self.timeline.append((now, point))

    def held_s(self, now: float) -> list[float]:
        """Seconds each row held its GPUs inside the window, up to ``now`` (the run's end)."""
        held = list(self._held_s)
        for index, slot in enumerate(self.slots):
            if slot.state != "off":
                held[index] += self._inside(slot.held_from_s, now)
        return held

    def figures(self, now: float, demand_timeline: dict[str, list[float]]) -> dict[str, object]:
        """The run's shape figures (module docstring)."""
        held = self.held_s(now)
        gpu_hours = sum(h * slot.spec.profile.gpus for h, slot in zip(held, self.slots, strict=True)) / 3600
        ready = [s.ready_s - s.start_s for s in self.starts if not math.isnan(s.ready_s)]
        warm = sum(1 for s in self.starts if s.warm)
        pools = sorted(self._pool_rows)
        return {
            "gpu_hours": round(gpu_hours, 6),
            "replica_starts": len(self.starts),
            "cold_starts": len(self.starts) - warm,
            "warm_starts": warm,
            "lost_in_scale_down": self.lost_in_scale_down,
            "time_to_ready_s": {
                "p50": round(float(np.percentile(ready, 50)), 3) if ready else None,
                "p95": round(float(np.percentile(ready, 95)), 3) if ready else None,
            },
            "timeline": {
                "t_s": [round(t - self.window[0], 3) for t, _ in self.timeline],
                "pools": {
                    f"{model}@{dc}": {
                        name: [point[(model, version, dc)][k] for _, point in self.timeline]
                        for k, name in enumerate(("desired", "loading", "ready", "draining"))
                    }
                    for model, version, dc in pools
                    if any(sum(point[(model, version, dc)]) for _, point in self.timeline)
                },
                "demand_per_s": demand_timeline,
            },
        }

    # --- inside -------------------------------------------------------------------------------

    def _size(self, key: PoolKey, role: str | None = None) -> int:
        """Replicas of the pool loading or ready (of ``role``: ``both`` counts ``decode`` too)."""
        return sum(
            1
            for i in self._pool_rows[key]
            if self.slots[i].state in ("loading", "ready")
            and (role is None or _role_of(self.slots[i]) == role)
        )

    def _gpus_used(self, dc: str) -> int:
        return sum(s.spec.profile.gpus for s in self.slots if s.spec.dc == dc and s.state != "off")

    def _start(self, key: PoolKey, rows: list[int], now: float, role: str) -> tuple[int, float] | None:
        model, _, dc = key
        index = next((i for i in rows if self.slots[i].state == "off"), None)
        if index is None:
            return None
        slot = self.slots[index]
        if self._gpus_used(dc) + slot.spec.profile.gpus > self.fleet.gpu_budget(dc):
            return None
        slot.spec = replace(slot.spec, role=role)
        load = self.fleet.shape.model(model)
        staged_at = self.staged[dc].get(model)
        warm = staged_at is not None and staged_at <= now
        self._set(index, "loading", now)
        slot.held_from_s = now
        slot.start = _Start(now, warm)
        self.starts.append(slot.start)
        return index, now + (load.warm_s if warm else load.cold_s)

    def _shrink(self, rows: list[int], excess: int, loads: Sequence[int], now: float) -> list[int]:
        loading = sorted(
            (i for i in rows if self.slots[i].state == "loading"), key=lambda i: -self.slots[i].since_s
        )
        for index in loading[:excess]:
            self._turn_off(index, now)
        excess -= min(excess, len(loading))
        ready = [i for i in rows if self.slots[i].state == "ready"]
        drains = sorted(ready, key=lambda i: (loads[i], i))[:excess]
        for index in drains:
            self._set(index, "draining", now)
        return drains

    def _turn_off(self, index: int, now: float) -> None:
        slot = self.slots[index]
        self._held_s[index] += self._inside(slot.held_from_s, now)
        self._set(index, "off", now)

    def _set(self, index: int, state: SlotState, now: float) -> None:
        slot = self.slots[index]
        slot.state, slot.since_s = state, now
        self._ready[index] = state == "ready"
        self._on[index] = state != "off"

    def _inside(self, start: float, end: float) -> float:
        return max(0.0, min(end, self.window[1]) - max(start, self.window[0]))

    def _stage(self, dc: str, models: tuple[str, ...], now: float) -> None:
        staged = self.staged.get(dc)
        if staged is None:
            return
        capacity = self.fleet.shape.dc(dc).warm_capacity
        for model in models[:capacity]:
            if model in staged:
                continue
            if len(staged) >= capacity:
                evictable = [m for m in staged if m not in models]
                if not evictable:
                    break
                del staged[evictable[0]]
            staged[model] = now + self.fleet.shape.model(model).cold_s
