"""FleetMind's planner: where replicas run and which weights stay warm, minutes ahead.

Every ``interval_s`` it turns the demand into replicas per model version and DC (the contract:
``agents/policy/planners/contract.py``). The parameters are ``PlannerParams``.

**Demand.** Per model version m and home DC h, the arrival rate x (first attempts, whatever
admission then did: a request SLOMax held or rejected is demand too) feeds Holt's linear trend::

    level  l <- a x + (1 - a)(l + b)        trend  b <- g (l - l_prev) + (1 - g) b
    forecast over a lead time L:  f(L) = max(l + b L / interval_s, l)

with ``a`` = ``level_smoothing``, ``g`` = ``trend_smoothing`` (b is per interval; a pair with
no arrivals this interval feeds x = 0). g is high enough that b follows a rise within a few
intervals: the forecast reaches a load time ahead, so a trend that lags starts replicas late.
Bursts shorter than a load time are not chased: the level smooths them, ``burst_margin`` and
admission absorb them. The lead time is the load time of a replica where it would start (warm
if that DC has m staged, else cold) plus one interval: a replica started now serves when the
forecast says it is needed.

**Capacity of one replica at the objective**, from the latency model TokenPilot calibrates
online (its decode-step law and its prior, ``tokenpilot/features.py``), fitted here on what
each pool reports: per pool and interval, its mean TPOT against its batch and context per
ready replica::

    TPOT ~ T0 + c B + d C        (an ``OnlineLinearModel`` per model version)

A replica runs B requests of context I + O/2 (I: mean prompt tokens of the arrivals, O: mean
output tokens of the completions; half the budget before any), each holding k KV tokens (what
the pools' heartbeats show: KV in use per running request, shared prefixes counted once; I + O/2
before any). The largest batch whose TPOT stays within ``tpot_headroom`` x the objective tau,
and whose KV fits ``kv_share`` of its cache K::

    B* = min((h tau - T0) / (c + d (I + O/2)),  kv_share K / k)
    decode rate r = B* / (T0 + B* (c + d (I + O/2))) tokens/s
    prefill takes p = a_prefill (1 - s) I of each request's time (a_prefill: the prior's cost
    of a prompt token; s: the share of prompt tokens the completions found in their
    instance's prefix cache)
    mu = kappa (r / O) / (1 + (r / O) p)      requests/s per replica

**Fed back from measured goodput.** kappa (per model version, 1 at the start) corrects the
model by what the completions say: over an interval with at least ``feedback_min_completed``
completions, q is the smaller of the share of them that met their objective and the share of
their prompt tokens that did (one long prompt that missed weighs as much as its size: a pool
too small for its long prompts shows here, where by count it would hide among short ones),

    q' <- f q + (1 - f) q'          (f = ``feedback_smoothing``; q' starts at the first q)
    q' < target:  kappa <- max(kappa_min, kappa (1 - feedback_gain (target - q')))
    q' >= target: kappa <- min(1, kappa + feedback_recovery)

with target = ``compliance_target``; kappa is not lowered while replicas of the model are still
loading (the objective missed for want of replicas already planned is not an error of the
model). Where the fluid estimate is too optimistic (long prompts blocking a small pool, prefill
slower than the prior), the pool gets more replicas until its requests meet their objectives
again, and gives them back slowly once they do. kappa stays above ``kappa_min``: where more
replicas do not help (a new replica starts with an empty prefix cache, so a pool that grows can
miss more long prompts for a while), the correction must not feed on itself.

**Replicas.** need(m, h) = (1 + ``burst_margin``) f(L) / mu, served in h's DC; what h's budget
cannot hold overflows to the DCs of h's region, then to any other (fail closed is the request
stage's job: residency-bound requests are held where no ready replica of their region
exists). Per pool the target is ceil(need), and then:

- floors: a model's ``min_replicas`` over the fleet (added where its need is largest), and each
  reservation's instances in the DC it is booked in (the first of its ``dcs`` with room);
- failure domains: a model with two replicas or more keeps one outside the domain of the rest,
  where a DC of another domain has room;
- budgets: while a DC's targets need more GPUs than it has, the pool with the most target above
  its need loses one (never below its floor);
- no flapping: a pool grows at once; it shrinks to the largest target of the last
  ``down_hold_s`` (a stabilisation window, as a Kubernetes HPA's: one dip of demand does not
  drain a replica, and its warm prefix cache, that the next rise needs again), by at most
  ``max_down_share`` of its size (at least one) per plan. When its DC cannot fit what another
  pool must grow by, the window does not apply: GPUs move between models as their peaks pass;

**Prefill : decode** (``split.py``), with ``split_gain`` set (None, the default: every replica
stays ``both``; dedicated prefill replicas pay only where the router sends them the prefills the
model counts on, which TokenPilot's pair rule does only to rescue a request's TTFT). Where a DC
has a KV link, a pool may run some replicas prefill only: when the fluid model says the split
serves the forecast with at least ``split_gain`` fewer replicas than all ``both`` (a ``both``
replica's decodes slow down while it prefills, a decode-only replica's do not; a pool that
splits already keeps splitting down to half that gain, so a ratio near the threshold does not
restart replicas plan after plan) and the link carries the prompts' KV cache within
``link_share`` of its rate. The pool's need is then scaled by that ratio, and
``Plan.prefill[pool]`` = round(share x target) of its replicas run prefill only (at least one,
and at least one left ``both``), share = (1/mu_p) / (1/mu_p + 1/mu_d).

**Warm weights.** Each DC keeps staged the models whose warm starts would save the most GPU
time once staged (staging takes a cold load) and over the ``warm_horizon_s`` (H) after: per
model, the starts it expects there times what one warm start saves,

    score(m) = max(0, need(m, t + cold_s(m) + H) - replicas(m)) x (cold_s(m) - warm_s(m)) x gpus(m)

highest first (ties: the larger saving per start), up to its ``warm_capacity``; a staged model
is replaced only by one scoring at least one start's saving more (the one that saves least
goes first), so staging does not churn.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from dataclasses import dataclass

from agents.policy.fleetmind.rules import FleetRules
from agents.policy.fleetmind.split import Split, StepLaw, Work, link_carries, split
from agents.policy.planners.contract import (
    DcState,
    DemandSample,
    FleetState,
    ModelSpec,
    Plan,
    PoolKey,
)
from agents.policy.tokenpilot.features import (
    PREFILL_PAIRS,
    PREFILL_TOKENS,
    PRIOR,
    STEPS,
    STEPS_X_BATCH,
    STEPS_X_CONTEXT,
)
from agents.policy.tokenpilot.predictor import OnlineLinearModel

ModelKey = tuple[str, str]


@dataclass(frozen=True, slots=True)
class PlannerParams:
    """FleetMind's planner (module docstring for what each does)."""

    interval_s: float = 30.0
    level_smoothing: float = 0.15
    trend_smoothing: float = 0.2
    burst_margin: float = 0.2
    tpot_headroom: float = 0.7
    kv_share: float = 0.85
    down_hold_s: float = 600.0
    max_down_share: float = 0.25
    warm_horizon_s: float = 900.0
    compliance_target: float = 0.99
    feedback_smoothing: float = 0.3
    feedback_gain: float = 2.0
    feedback_recovery: float = 0.02
    feedback_min_completed: int = 20
    kappa_min: float = 0.7
    split_gain: float | None = None
    link_share: float = 0.8


@dataclass(slots=True)
class _Holt:
    level: float = 0.0
    trend: float = 0.0  # per interval
    seen: bool = False

    def update(self, x: float, a: float, g: float) -> None:
        if not self.seen:
            self.level, self.trend, self.seen = x, 0.0, True
            return
        previous = self.level
        self.level = a * x + (1 - a) * (self.level + self.trend)
        self.trend = g * (self.level - previous) + (1 - g) * self.trend

    def forecast(self, intervals: float) -> float:
        return max(self.level + self.trend * intervals, self.level, 0.0)


@dataclass(slots=True)
class _Work:
    """Mean prompt tokens per arrival and output tokens per completion, smoothed."""

    input_tokens: float = 0.0
    output_tokens: float = 0.0
    budget: float = 0.0
    cached_share: float = 0.0
    kv_per_request: float = 0.0  # KV tokens a running request holds (shared prefixes once)
    kappa: float = 1.0  # the correction fed back from measured goodput
    met_share: float | None = None  # q', the smoothed share of completions within objective

    def update(self, sample: DemandSample, a: float) -> None:
        if sample.arrivals:
            self.input_tokens = _smooth(self.input_tokens, sample.input_tokens / sample.arrivals, a)
            self.budget = _smooth(self.budget, sample.output_budget / sample.arrivals, a)
        if sample.completed:
            self.output_tokens = _smooth(self.output_tokens, sample.output_tokens / sample.completed, a)
        if sample.completed_input_tokens:
            share = sample.cached_tokens / sample.completed_input_tokens
            self.cached_share = _smooth(self.cached_share, share, a)

    @property
    def output(self) -> float:
        return self.output_tokens or max(self.budget / 2, 1.0)


def _prefill_count(share: float, replicas: int) -> int:
    """round(share x replicas), at least one, and at least one replica left ``both`` (0 where
    the pool does not split)."""
    if share <= 0 or replicas < 2:
        return 0
    return min(max(round(share * replicas), 1), replicas - 1)


def _smooth(old: float, new: float, a: float) -> float:
    return new if old == 0 else a * new + (1 - a) * old


class FleetMindPlanner:
    """FleetMind's second timescale (module docstring)."""

    name = "fleetmind"

    def __init__(self, rules: FleetRules | None = None, params: PlannerParams | None = None) -> None:
        self.rules = rules or FleetRules()
        self.params = params or PlannerParams()
        self.interval_s = self.params.interval_s
        self._demand: dict[PoolKey, _Holt] = defaultdict(_Holt)  # (model, version, home DC)
        self._work: dict[ModelKey, _Work] = defaultdict(_Work)
        self._latency: dict[ModelKey, OnlineLinearModel] = {}
        self._recent: dict[PoolKey, deque[tuple[float, int]]] = defaultdict(deque)  # (time, target)
        self._floor: dict[PoolKey, int] = defaultdict(int)  # this plan's floor per pool
        self._splitting: set[PoolKey] = set()  # pools whose last plan ran prefill-only replicas

    # --- the plan -----------------------------------------------------------------------------

    def plan(self, state: FleetState) -> Plan:
        """The replicas and warm weights for ``state`` (module docstring)."""
        self._learn(state)
        dcs = {dc.name: dc for dc in state.dcs}
        need: dict[PoolKey, float] = defaultdict(float)
        later: dict[PoolKey, float] = defaultdict(float)
        why: dict[PoolKey, list[str]] = defaultdict(list)
        forecast: dict[PoolKey, float] = defaultdict(float)
        for (model, version, home), holt in self._demand.items():
            spec = state.model_spec(model, version)
            if spec is None:
                continue
            mu = self.replica_rate(spec, state.slo_tpot_s)
            dc = home if home in dcs else state.dcs[0].name
            lead = (self._load_s(spec, dcs[dc], state.now_s) + self.interval_s) / self.interval_s
            margin = 1 + self.params.burst_margin
            need[(model, version, dc)] += margin * holt.forecast(lead) / mu
            forecast[(model, version, dc)] += holt.forecast(lead)
            horizon = spec.load_cold_s + self.params.warm_horizon_s  # staging takes a cold load
            later[(model, version, dc)] += margin * holt.forecast(horizon / self.interval_s) / mu
            why[(model, version, dc)].append(f"{home}: {holt.forecast(lead):.2f}/s forecast")
        shares = self._prefill_shares(state, dcs, forecast, need, why)
        target = self._targets(state, dcs, need)
        replicas = self._steady(state, dcs, target, need)
        prefill = {key: _prefill_count(shares.get(key, 0.0), n) for key, n in replicas.items()}
        reasons = {
            key: (
                f"need {need.get(key, 0.0):.2f} replicas at {self._rate_text(state, key)}; "
                + ", ".join(why.get(key, ["no demand"]))
                + f"; {state.pool(*key).replicas} -> {n}"
                + (f", {prefill[key]} prefill only" if prefill.get(key) else "")
            )
            for key, n in replicas.items()
        }
        return Plan(replicas, self._warm(state, later, replicas), reasons, prefill)

    def split_for(self, spec: ModelSpec, state: FleetState) -> Split:
        """The prefill : decode split of ``spec``'s work at the planned objective (``split.py``)."""
        work = self._work[(spec.model, spec.version)]
        t0, c, d = (float(v) for v in self._model(spec).theta[:3])
        law = StepLaw(t0, c, d, PRIOR[PREFILL_TOKENS], PRIOR[PREFILL_PAIRS])
        context = work.input_tokens + work.output / 2
        mean = Work(work.input_tokens, work.cached_share, work.output, work.kv_per_request or context)
        p = self.params
        objective = (state.slo_tpot_s, state.slo_ttft_s)
        return split(law, mean, *objective, spec.kv_tokens, p.tpot_headroom, p.kv_share)

    def _prefill_shares(
        self,
        state: FleetState,
        dcs: dict[str, DcState],
        forecast: dict[PoolKey, float],
        need: dict[PoolKey, float],
        why: dict[PoolKey, list[str]],
    ) -> dict[PoolKey, float]:
        """Per pool that splits: its prefill share; its need scaled by the split's ratio."""
        shares: dict[PoolKey, float] = {}
        if self.params.split_gain is None:
            return shares
        for key, rate in forecast.items():
            spec, dc = state.model_spec(key[0], key[1]), dcs[key[2]]
            if spec is None or dc.kv_link_gbps <= 0 or not spec.kv_bytes_per_token:
                continue
            found = self.split_for(spec, state)
            work = self._work[(spec.model, spec.version)]
            mean = Work(work.input_tokens, work.cached_share, work.output, 0.0)
            link = (dc.kv_link_gbps, self.params.link_share)
            gain = self.params.split_gain / (2 if key in self._splitting else 1)
            if found.ratio > 1 - gain or not link_carries(rate, mean, spec.kv_bytes_per_token, *link):
                self._splitting.discard(key)
                continue
            self._splitting.add(key)
            need[key] *= found.ratio
            shares[key] = found.prefill_share
            why[key].append(f"split {found.prefill_share:.2f} prefill saves {1 - found.ratio:.0%}")
        return shares

    def replica_rate(self, spec: ModelSpec, tpot_s: float) -> float:
        """mu: requests/s one replica of ``spec`` serves within the TPOT objective (docstring)."""
        work = self._work[(spec.model, spec.version)]
        theta = self._model(spec).theta
        t0, c, d = (float(v) for v in theta[:3])
        context = work.input_tokens + work.output / 2
        budget = self.params.tpot_headroom * tpot_s
        batch = (budget - t0) / max(c + d * context, 1e-12)
        if spec.kv_tokens:
            footprint = work.kv_per_request or context
            batch = min(batch, self.params.kv_share * spec.kv_tokens / max(footprint, 1.0))
        batch = max(batch, 1.0)
        step = t0 + batch * (c + d * context)
        per_request = (batch / step) / work.output  # requests/s of decoding alone
        prefill = PRIOR[PREFILL_TOKENS] * work.input_tokens * (1 - work.cached_share)
        return work.kappa * per_request / (1 + per_request * prefill)

    # --- learning -----------------------------------------------------------------------------

    def _learn(self, state: FleetState) -> None:
        p = self.params
        arrivals: dict[PoolKey, float] = {key: 0.0 for key in self._demand}
        for sample in state.demand:
            key = (sample.model, sample.version, sample.home_dc)
            arrivals[key] = arrivals.get(key, 0.0) + sample.rate_per_s
            self._work[(sample.model, sample.version)].update(sample, p.level_smoothing)
        for key, rate in arrivals.items():
            self._demand[key].update(rate, p.level_smoothing, p.trend_smoothing)
        outcomes: dict[ModelKey, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        for sample in state.demand:
            tally = outcomes[(sample.model, sample.version)]
            tally[0] += sample.completed
            tally[1] += sample.met_slo
            tally[2] += sample.completed_input_tokens
            tally[3] += sample.met_input_tokens
        loading = {(pool.model, pool.version) for pool in state.pools if pool.loading}
        for model, (completed, met, tokens, met_tokens) in outcomes.items():
            if completed >= p.feedback_min_completed:
                share = min(met / completed, met_tokens / tokens if tokens else 1.0)
                self._feed_back(self._work[model], share, model in loading)
        for pool in state.pools:
            spec = state.model_spec(pool.model, pool.version)
            if spec is None or pool.tpot_s is None or not pool.ready or not pool.running:
                continue
            x = (1.0, pool.running / pool.ready, pool.tokens_in_flight / pool.ready)
            self._model(spec).update(x, pool.tpot_s)
            if spec.kv_tokens and pool.kv_usage > 0:
                footprint = pool.kv_usage * spec.kv_tokens * pool.ready / pool.running
                work = self._work[(spec.model, spec.version)]
                work.kv_per_request = _smooth(work.kv_per_request, footprint, p.level_smoothing)

    def _feed_back(self, work: _Work, share: float, loading: bool) -> None:
        """kappa from the share of completions that met their objective (module docstring);
        ``loading``: replicas of the model are still loading (a shortfall, not an error of the
        model: kappa is not lowered)."""
        p = self.params
        f = p.feedback_smoothing
        work.met_share = share if work.met_share is None else f * share + (1 - f) * work.met_share
        share = work.met_share
        if share < p.compliance_target:
            if loading:
                return
            work.kappa = max(p.kappa_min, work.kappa * (1 - p.feedback_gain * (p.compliance_target - share)))
        else:
            work.kappa = min(1.0, work.kappa + p.feedback_recovery)

    def _model(self, spec: ModelSpec) -> OnlineLinearModel:
        key = (spec.model, spec.version)
        if key not in self._latency:
            prior = (PRIOR[STEPS], PRIOR[STEPS_X_BATCH], PRIOR[STEPS_X_CONTEXT])
            self._latency[key] = OnlineLinearModel(("steps", "steps_x_batch", "steps_x_context"), prior)
        return self._latency[key]

    def _rate_text(self, state: FleetState, key: PoolKey) -> str:
        spec = state.model_spec(key[0], key[1])
        if spec is None:
            return "unknown model"
        return f"{self.replica_rate(spec, state.slo_tpot_s):.2f} req/s per replica"

    # --- from need to targets -----------------------------------------------------------------

    def _load_s(self, spec: ModelSpec, dc: DcState, now_s: float) -> float:
        return spec.load_warm_s if spec.model in dc.warm else spec.load_cold_s

    def _targets(
        self, state: FleetState, dcs: dict[str, DcState], need: dict[PoolKey, float]
    ) -> dict[PoolKey, int]:
        """ceil(need) per pool, overflowed, floored, spread and fitted to the budgets."""
        target: dict[PoolKey, int] = {key: math.ceil(n - 1e-9) for key, n in need.items() if n > 0}
        for pool in state.pools:  # every known pool gets a target (0 where nothing is needed)
            target.setdefault(pool.key, 0)
        self._overflow(state, dcs, target)
        self._floors(state, dcs, target, need)
        self._spread(state, dcs, target)
        self._fit(dcs, state, target, need)
        return target

    def _gpus(self, state: FleetState, key: PoolKey) -> int:
        spec = state.model_spec(key[0], key[1])
        return spec.gpus if spec else 1

    def _overflow(self, state: FleetState, dcs: dict[str, DcState], target: dict[PoolKey, int]) -> None:
        """What a DC's budget cannot hold moves to its region's DCs, then to any other."""
        for name, dc in dcs.items():
            keys = [k for k in target if k[2] == name]
            used = sum(target[k] * self._gpus(state, k) for k in keys)
            while used > dc.gpus and keys:
                key = max(keys, key=lambda k: target[k])
                if target[key] == 0:
                    break
                others = sorted(
                    (
                        d
                        for d in dcs.values()
                        if d.name != name and self._free(state, d, target) >= self._gpus(state, key)
                    ),
                    key=lambda d: (d.region != dc.region, -self._free(state, d, target), d.name),
                )
                if not others:
                    break
                target[key] -= 1
                moved = (key[0], key[1], others[0].name)
                target[moved] = target.get(moved, 0) + 1
                used -= self._gpus(state, key)

    def _free(self, state: FleetState, dc: DcState, target: dict[PoolKey, int]) -> int:
        return dc.gpus - sum(n * self._gpus(state, k) for k, n in target.items() if k[2] == dc.name)

    def _floors(
        self,
        state: FleetState,
        dcs: dict[str, DcState],
        target: dict[PoolKey, int],
        need: dict[PoolKey, float],
    ) -> None:
        """Each model's ``min_replicas`` and each reservation's instances (``_floor``)."""
        self._floor.clear()
        for reservation in self.rules.reservations:
            for spec in state.models:
                if spec.model != reservation.model:
                    continue
                for dc in reservation.dcs:
                    if dc in dcs and dcs[dc].gpus >= reservation.instances * spec.gpus:
                        key = (spec.model, spec.version, dc)
                        self._floor[key] = max(self._floor[key], reservation.instances)
                        target[key] = max(target.get(key, 0), reservation.instances)
                        break
        for spec in state.models:
            keys = [k for k in target if k[:2] == (spec.model, spec.version)]
            keys = keys or [(spec.model, spec.version, state.dcs[0].name)]
            while sum(target.get(k, 0) for k in keys) < spec.min_replicas:
                key = max(keys, key=lambda k: (need.get(k, 0.0), k))
                target[key] = target.get(key, 0) + 1
                self._floor[key] += 1

    def _spread(self, state: FleetState, dcs: dict[str, DcState], target: dict[PoolKey, int]) -> None:
        """A model with two replicas or more keeps one outside the domain of the rest."""
        for spec in state.models:
            keys = [k for k, n in target.items() if k[:2] == (spec.model, spec.version) and n > 0]
            if sum(target[k] for k in keys) < 2:
                continue
            domains = {dcs[k[2]].failure_domain for k in keys}
            if len(domains) > 1:
                continue
            elsewhere = [
                d
                for d in dcs.values()
                if d.failure_domain not in domains and self._free(state, d, target) >= spec.gpus
            ]
            if not elsewhere:
                continue
            movable = [k for k in keys if target[k] > self._floor.get(k, 0)]
            if not movable:
                continue  # reserved where they are
            home = dcs[keys[0][2]]
            dc = min(elsewhere, key=lambda d: (d.region != home.region, d.name))
            biggest = max(movable, key=lambda k: target[k])
            target[biggest] -= 1
            key = (spec.model, spec.version, dc.name)
            target[key] = target.get(key, 0) + 1

    def _fit(
        self,
        dcs: dict[str, DcState],
        state: FleetState,
        target: dict[PoolKey, int],
        need: dict[PoolKey, float],
    ) -> None:
        """While a DC's targets need more GPUs than it has, the pool with the most target above
        its need loses one (never below its floor)."""
        for name, dc in dcs.items():
            while self._free(state, dc, target) < 0:
                keys = [k for k in target if k[2] == name and target[k] > self._floor.get(k, 0)]
                if not keys:
                    break
                key = max(keys, key=lambda k: (target[k] - need.get(k, 0.0), k))
                target[key] -= 1

    def _steady(
        self,
        state: FleetState,
        dcs: dict[str, DcState],
        target: dict[PoolKey, int],
        need: dict[PoolKey, float],
    ) -> dict[PoolKey, int]:
        """Grow at once; shrink to the largest target of the last ``down_hold_s``, a share at
        a time (module docstring)."""
        p = self.params
        wanted = {  # DCs where a pool wants to grow beyond what is free now
            dc.name
            for dc in state.dcs
            for key, n in target.items()
            if key[2] == dc.name
            and n > state.pool(*key).replicas
            and (n - state.pool(*key).replicas) * self._gpus(state, key) > dc.gpus - dc.gpus_used
        }
        replicas = {}
        for key, n in target.items():
            recent = self._recent[key]
            size = state.pool(*key).replicas
            if not recent:  # as an HPA starts: the current size is the first recommendation
                recent.append((state.now_s, size))
            recent.append((state.now_s, n))
            while recent and state.now_s - recent[0][0] > p.down_hold_s:
                recent.popleft()
            if n >= size:
                replicas[key] = n
                continue
            floor = n if key[2] in wanted else max(t for _, t in recent)
            step = max(1, math.floor(size * p.max_down_share))
            replicas[key] = max(floor, size - step, n) if floor < size else size
        return replicas

    # --- warm weights -------------------------------------------------------------------------

    def _warm(
        self, state: FleetState, later: dict[PoolKey, float], replicas: dict[PoolKey, int]
    ) -> dict[str, tuple[str, ...]]:
        """Per DC, the models it is most likely to start next (module docstring)."""
        warm = {}
        for dc in state.dcs:
            if dc.warm_capacity <= 0:
                continue
            score: dict[str, float] = defaultdict(float)
            saving: dict[str, float] = {}
            for spec in state.models:
                key = (spec.model, spec.version, dc.name)
                saving[spec.model] = (spec.load_cold_s - spec.load_warm_s) * spec.gpus
                starts = max(0.0, later.get(key, 0.0) - replicas.get(key, state.pool(*key).replicas))
                score[spec.model] += starts * saving[spec.model]
            ranked = sorted(score, key=lambda m: (-score[m], -saving[m], m))
            keep = [m for m in (*dc.warm, *dc.staging) if m in score]
            chosen = list(keep)
            for model in ranked:
                if model in chosen:
                    continue
                if len(chosen) < dc.warm_capacity:
                    chosen.append(model)
                    continue
                weakest = min(chosen, key=lambda m: (score[m], saving[m]))
                if score[model] >= score[weakest] + saving[model]:
                    chosen[chosen.index(weakest)] = model
            warm[dc.name] = tuple(chosen[: dc.warm_capacity])
        return warm
