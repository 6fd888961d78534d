"""``hpa``: the Kubernetes HorizontalPodAutoscaler, one per pool, on vLLM's waiting requests.

The algorithm follows kubernetes/kubernetes ``pkg/controller/podautoscaler/`` as of the release
line with per-direction tolerances (``Tolerances.isWithin``, v1.33 on), read through the file
index (the repository is too large to mirror; the index gives no commit for these versions):
``replica_calculator.go`` (``GetExternalPerPodMetricReplicas``), ``horizontal.go``
(``reconcileAutoscaler``, ``stabilizeRecommendationWithBehaviors``,
``convertDesiredReplicasWithBehaviorRate``, ``calculateScaleUpLimitWithScalingRules``,
``calculateScaleDownLimitWithBehaviors``, ``storeScaleEvent``), the behaviour defaults of
``pkg/apis/autoscaling/v2/defaults.go`` and the controller flags' defaults
(``--horizontal-pod-autoscaler-sync-period`` 15 s, ``-tolerance`` 0.1,
``-downscale-stabilization`` 5 min).

The metric, as vLLM users scale with KEDA: ``vllm:num_requests_waiting``, target 5 per replica
(vllm-project/production-stack ``tutorials/20-keda-autoscaling.md``, commit
5ba881302d59af342d154f17447bba6a85e0091f: a Prometheus trigger with ``threshold: '5'``, which
KEDA turns into an HPA External metric with an ``AverageValue`` target, ``0/5 (avg)``). KServe's
and llm-d's guides name the same signal: requests queued (llm-d reads it at its gateway, the EPP
flow-control queue), with KV-cache usage as the alternative; queue depth is the one they lead
with. Here it is the sum of ``PoolState.waiting`` (the pool's ready replicas' queues); a loading
replica has no ``/metrics`` yet and adds nothing to the sum.

Every ``sync_period_s``, per pool ``(model, version, dc)`` (a Deployment per model per data
centre with its own HPA; a pool is autoscaled once it has been seen with a replica), with
``current`` the Deployment's replicas (the planner's last decision: pods the DC cannot fit yet
are Pending, and count):

1. Bounds: ``min = max(1, ceil(model floor / pools of the model))`` (``minReplicas`` defaults to
   1), ``max`` = the DC's GPUs over the model's GPUs per replica. ``current > max`` -> max;
   ``current < min`` -> min; otherwise:
2. Metric (External, AverageValue): ``ratio = waiting / (target * current)``; within the
   tolerance band ``[1 - tolerance, 1 + tolerance]`` the proposal is ``current``, else
   ``ceil(waiting / target)``.
3. Stabilisation: every proposal is recorded; scale-down takes the highest proposal of the last
   ``scale_down_window_s`` (300 s) and scale-up the lowest of the last ``scale_up_window_s``
   (0 s: none but the new one); ``current`` is moved only as far as both allow.
4. Rate (behaviour defaults): up to ``max(start + 4, ceil(start * 2))`` replicas per 15 s, where
   ``start`` is the replica count at the start of the period (replicas added in the last 15 s
   taken off, removed ones put back); down to ``start * (1 - 100 %)`` per 15 s, i.e. no limit
   but ``min``. The result is clamped to ``[min, max]`` in the direction it moves.

Scale from zero is not the HPA's (KEDA's activation does it, on a metric that exists without a
replica, which ``vllm:num_requests_waiting`` does not): a pool never seen with a replica is
never planned, and a planned pool never goes below ``min``. Warm weights are not planned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agents.policy.planners.contract import FleetState, Plan, PoolKey, PoolState


@dataclass(frozen=True, slots=True)
class HpaParams:
    """The HPA's defaults (module docstring): ``sync_period_s``, ``tolerance`` (both directions),
    ``target_waiting`` (waiting requests per replica), the stabilisation windows, the behaviour
    policies (``scale_up_pods`` and ``scale_up_percent`` per ``scale_up_period_s``, select Max;
    ``scale_down_percent`` per ``scale_down_period_s``) and ``min_replicas`` (``minReplicas``)."""

    sync_period_s: float = 15.0
    tolerance: float = 0.1
    target_waiting: float = 5.0
    scale_down_window_s: float = 300.0
    scale_up_window_s: float = 0.0
    scale_up_pods: int = 4
    scale_up_percent: float = 100.0
    scale_up_period_s: float = 15.0
    scale_down_percent: float = 100.0
    scale_down_period_s: float = 15.0
    min_replicas: int = 1

    def __post_init__(self) -> None:
        if not self.sync_period_s > 0 or not self.target_waiting > 0 or self.tolerance < 0:
            raise ValueError("sync_period_s and target_waiting must be > 0, tolerance >= 0")
        if self.min_replicas < 1:
            raise ValueError("min_replicas must be >= 1 (an HPA does not scale from zero)")


@dataclass(slots=True)
class _Autoscaler:
    """One HPA's memory: the Deployment's replicas, its recent proposals and scale events."""

    replicas: int
    proposals: list[tuple[float, int]] = field(default_factory=list)
    ups: list[tuple[float, int]] = field(default_factory=list)
    downs: list[tuple[float, int]] = field(default_factory=list)


class HpaPlanner:
    """The Kubernetes HPA per pool (module docstring)."""

    name = "hpa"

    def __init__(self, params: HpaParams | None = None) -> None:
        self.params = params if params is not None else HpaParams()
        self.interval_s = self.params.sync_period_s
        self._hpas: dict[PoolKey, _Autoscaler] = {}

    def plan(self, state: FleetState) -> Plan:
        """One sync of every HPA (module docstring)."""
        for pool in state.pools:
            if pool.replicas > 0 and pool.key not in self._hpas:
                # The controller's first recommendation is the replica count it finds.
                self._hpas[pool.key] = _Autoscaler(pool.replicas, [(state.now_s, pool.replicas)])
        replicas: dict[PoolKey, int] = {}
        reasons: dict[PoolKey, str] = {}
        for key in sorted(self._hpas):
            hpa = self._hpas[key]
            bounds = self._bounds(state, key)
            if bounds is None:
                reasons[key] = "hpa: no model spec for this pool; it keeps its size"
                continue
            desired, reason = self._sync(hpa, state.pool(*key), bounds, state.now_s)
            if desired != hpa.replicas:
                change = (state.now_s, abs(desired - hpa.replicas))
                (hpa.ups if desired > hpa.replicas else hpa.downs).append(change)
                hpa.replicas = desired
            replicas[key] = desired
            reasons[key] = reason
        return Plan(replicas=replicas, reasons=reasons)

    def _bounds(self, state: FleetState, key: PoolKey) -> tuple[int, int] | None:
        """(minReplicas, maxReplicas) of the pool's HPA (step 1 of the module docstring)."""
        spec = state.model_spec(key[0], key[1])
        if spec is None:
            return None
        pools = sum(1 for k in self._hpas if k[:2] == key[:2])
        low = max(self.params.min_replicas, math.ceil(spec.min_replicas / pools))
        gpus = next((dc.gpus for dc in state.dcs if dc.name == key[2]), None)
        high = gpus // max(spec.gpus, 1) if gpus is not None else self._hpas[key].replicas
        return low, max(high, low)

    def _sync(
        self, hpa: _Autoscaler, pool: PoolState, bounds: tuple[int, int], now_s: float
    ) -> tuple[int, str]:
        p = self.params
        low, high = bounds
        current = hpa.replicas
        cutoff = now_s - max(p.scale_up_period_s, p.scale_down_period_s)
        hpa.ups = [event for event in hpa.ups if event[0] > cutoff]
        hpa.downs = [event for event in hpa.downs if event[0] > cutoff]
        if current > high:
            return high, f"hpa: {current} replicas above maxReplicas {high} (the DC's GPUs)"
        if current < low:
            return low, f"hpa: {current} replicas below minReplicas {low}"
        waiting = pool.waiting
        ratio = waiting / (p.target_waiting * current)
        within = 1 - p.tolerance <= ratio <= 1 + p.tolerance
        proposal = current if within else math.ceil(waiting / p.target_waiting)
        stabilised = self._stabilise(hpa, proposal, now_s)
        desired, limit = self._rate_limit(hpa, stabilised, bounds, now_s)
        band = "within" if within else "outside"
        reason = (
            f"hpa: vllm:num_requests_waiting {waiting} on {current} replicas, target "
            f"{p.target_waiting:g} each: ratio {ratio:.2f} {band} tolerance {p.tolerance:g} -> "
            f"proposal {proposal}; stabilised {stabilised} (highest of the last "
            f"{p.scale_down_window_s:g} s); {limit} -> {desired}"
        )
        return desired, reason

    def _stabilise(self, hpa: _Autoscaler, proposal: int, now_s: float) -> int:
        """Step 3 of the module docstring; records ``proposal``."""
        p = self.params
        up_cutoff, down_cutoff = now_s - p.scale_up_window_s, now_s - p.scale_down_window_s
        up = down = proposal
        for at, value in hpa.proposals:
            if at > up_cutoff:
                up = min(up, value)
            if at > down_cutoff:
                down = max(down, value)
        recommendation = min(max(hpa.replicas, up), down)
        oldest = min(up_cutoff, down_cutoff)
        hpa.proposals = [(at, value) for at, value in hpa.proposals if at > oldest]
        hpa.proposals.append((now_s, proposal))
        return recommendation

    def _rate_limit(
        self, hpa: _Autoscaler, desired: int, bounds: tuple[int, int], now_s: float
    ) -> tuple[int, str]:
        """Step 4 of the module docstring: (replicas, the limit that applied, in words)."""
        p = self.params
        low, high = bounds
        current = hpa.replicas
        if desired > current:
            start = self._period_start(hpa, p.scale_up_period_s, now_s)
            limit = max(start + p.scale_up_pods, math.ceil(start * (1 + p.scale_up_percent / 100)))
            limit = max(limit, current)
            allowed = min(high, limit)
            return min(desired, allowed), f"scale-up limit {limit} per {p.scale_up_period_s:g} s, max {high}"
        if desired < current:
            start = self._period_start(hpa, p.scale_down_period_s, now_s)
            limit = min(int(start * (1 - p.scale_down_percent / 100)), current)
            allowed = max(low, limit)
            return max(
                desired, allowed
            ), f"scale-down limit {limit} per {p.scale_down_period_s:g} s, min {low}"
        return desired, "no change"

    @staticmethod
    def _period_start(hpa: _Autoscaler, period_s: float, now_s: float) -> int:
        """Replicas at the start of the policy period: now, less what was added in it, plus
        what was removed."""
        cutoff = now_s - period_s
        added = sum(n for at, n in hpa.ups if at > cutoff)
        removed = sum(n for at, n in hpa.downs if at > cutoff)
        return hpa.replicas - added + removed


__all__ = ["HpaParams", "HpaPlanner"]
