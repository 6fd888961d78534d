"""``dynamo-sla``: NVIDIA Dynamo's SLA planner, one per pool, on an aggregated engine.

Followed from ``ai-dynamo/dynamo`` (read through the file index; the repository is too large to
mirror; the commits are those of the versions read): ``components/src/dynamo/planner/``
``config/defaults.py`` at bb6bb8ffa30ff4a15f49fa26b71cd7cbc414e038 (``SLAPlannerDefaults``),
``config/planner_config.py`` at 34ede16dab9c3ab997417da502b39f4df72ce9e5,
``core/throughput_scaling.py`` at 4d3f6720885f50f71ff72506c81957aef2cc8287 (``_throughput_agg``,
``_compute_prefill_replicas``, ``_compute_decode_replicas``), ``core/perf_model/agg.py`` at
518a70279da932774915f3b039b6978f9b1057f8 (``find_best_engine_agg_rps``),
``core/load/predictors.py`` at 260b6ae9412cea46626b25b11407fbebd30e5cb0 (``ARIMAPredictor``),
``core/throughput/interpolation.py`` at 6c2186447653b2e5f63168cb5324b7cace96eacc, and the
profiler ``benchmarks/profiler/utils/profile_prefill.py`` and
``benchmarks/profiler/utils/profile_decode.py`` (the profiling step, ``sim/engine/profiling.py``
here).

Shipped defaults kept: ``throughput_adjustment_interval`` 180 s (``interval_s``), load predictor
``arima``, ``min_endpoint`` 1, the context of a decoding request ``isl + osl / 2``, requests
shorter or longer than the profiled grid clamped to its ends, no stabilisation (each plan
applies at once). The SLO targets are the ones the profile was measured at (``DynamoProfile``:
the fleet's interactive TTFT and TPOT when the simulator profiles), as a Dynamo user sets
``ttft`` / ``itl`` to their objective.

Every ``interval_s`` seconds, per pool ``(model, version, dc)`` (one Dynamo deployment per model
per data centre; a pool is planned once it has been seen with a replica, as a deployment that
exists):

1. Observe the last interval: num_req = first arrivals whose home DC is the pool's (demand from
   a home DC with no pool of the model is shared among its pools by their replicas), isl = mean
   prompt tokens of those arrivals, osl = mean output tokens of the requests completed. An idle
   interval carries the last isl / osl forward (Dynamo's builtin load predictor).
2. Predict the next interval's rate, isl and osl, each with its own predictor (below).
3. Aggregated replicas. Dynamo plans prefill and decode workers apart, and in its ``agg`` mode
   one engine does both: ``engine_rps`` is the request rate one engine sustains with both TTFT
   and ITL within target, and ``replicas = max(ceil(rate / engine_rps), min_endpoint)``. Its
   agg model's iteration time is additive in the prefill tokens and the decode work of the
   iteration, so one replica's time shares add::

       prefill_need = rate * isl / P(isl)          P: prefill tokens/s of a replica (profile)
       decode_need  = rate * osl / D(isl + osl/2)  D: decode tokens/s at the ITL target (profile)
       replicas     = max(ceil(prefill_need + decode_need), floor),  at most the DC's budget

   with ``1 / engine_rps = isl / P + osl / D``: the sum of the prefill and decode needs.
   floor = max(min_endpoint, ceil(model floor / pools of the model)); the budget is what the
   DC's GPUs hold of this model's replicas (Dynamo's ``max_gpu_budget`` clamp).

What is not carried over: Dynamo corrects the profile online (TTFT / ITL correction factors,
newer versions an online regression of forward-pass metrics); a ``FleetState`` carries no
measured TTFT or ITL, so the profile is used as measured. Predictors: ``constant`` and
``arima`` (the default); ``kalman`` and ``prophet`` are not built.

The ARIMA predictor (Dynamo: ``pmdarima.auto_arima`` fitted once, then updated) in numpy, as
its simplest faithful form: the order is chosen once, at the fifth point -- d by the KPSS test
(level, 5 % critical value 0.463, Bartlett window ``trunc(4 (n/100)^(1/4))``, up to d = 2),
then p in 0..5 by AIC over AR(p) fits by least squares (an intercept when d < 2); MA terms are
not searched (q = 0). If the order collapses to p = 0 on the raw series, it is chosen again on
log1p(y) and that space is kept (Dynamo's fallback for spiky series). Every later prediction
refits the coefficients of that order on the whole history and forecasts one step. As in Dynamo:
fewer than five points or a constant history predict the last value, leading zeros are skipped,
non-finite readings count as zero, forecasts are floored at zero.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from agents.policy.planners.contract import FleetState, Plan, PoolKey, PoolState

Predictor = Literal["arima", "constant"]

KPSS_CRITICAL_5PCT = 0.463
"""The KPSS level-stationarity statistic's critical value at 5 % (Kwiatkowski et al., table 1)."""


@dataclass(frozen=True, slots=True)
class DynamoProfile:
    """What Dynamo's profiling step measures of one replica of a model version, against the
    targets ``ttft_s`` / ``itl_s`` (seconds).

    Prefill (``prefill_*``, by prompt length ``prefill_isl``): the TTFT of one request alone and
    the prefill throughput ``isl / TTFT`` in tokens/s per replica (Dynamo's
    ``prefill_thpt_per_gpu`` times the replica's GPUs). Decode (``decode_*``, by context length
    ``decode_context``): the largest concurrency whose inter-token latency stays within
    ``itl_s``, that latency, and the decode throughput ``concurrency / ITL`` in tokens/s per
    replica. Grids strictly increasing; values looked up by linear interpolation, clamped at the
    ends (Dynamo interpolates cubically with scipy).
    """

    ttft_s: float
    itl_s: float
    prefill_isl: tuple[float, ...]
    prefill_ttft_s: tuple[float, ...]
    prefill_tokens_per_s: tuple[float, ...]
    decode_context: tuple[float, ...]
    decode_itl_s: tuple[float, ...]
    decode_concurrency: tuple[int, ...]
    decode_tokens_per_s: tuple[float, ...]

    def __post_init__(self) -> None:
        for name, grid, columns in (
            ("prefill", self.prefill_isl, (self.prefill_ttft_s, self.prefill_tokens_per_s)),
            (
                "decode",
                self.decode_context,
                (self.decode_itl_s, self.decode_concurrency, self.decode_tokens_per_s),
            ),
        ):
            if not grid or any(len(column) != len(grid) for column in columns):
                raise ValueError(f"{name} profile: empty, or columns of different lengths")
            if any(b <= a for a, b in itertools.pairwise(grid)):
                raise ValueError(f"{name} profile: its grid must be strictly increasing")
            if any(not v > 0 for column in columns for v in column):
                raise ValueError(f"{name} profile: every measurement must be > 0")

    def prefill_ttft(self, isl: float) -> float:
        return float(np.interp(isl, self.prefill_isl, self.prefill_ttft_s))

    def prefill_throughput(self, isl: float) -> float:
        """P(isl): prefill tokens/s of one replica."""
        return float(np.interp(isl, self.prefill_isl, self.prefill_tokens_per_s))

    def decode_throughput(self, context: float) -> float:
        """D(context): decode tokens/s of one replica at the ITL target."""
        return float(np.interp(context, self.decode_context, self.decode_tokens_per_s))

    def engine_rps(self, isl: float, osl: float) -> float:
        """Requests/s one aggregated replica sustains: ``1 / (isl / P(isl) + osl / D(isl + osl/2))``."""
        seconds = isl / self.prefill_throughput(isl) + osl / self.decode_throughput(isl + osl / 2)
        return 1.0 / seconds if seconds > 0 else math.inf


@dataclass(frozen=True, slots=True)
class DynamoSlaParams:
    """Dynamo's SLA planner defaults (module docstring): ``adjustment_interval_s``
    (``throughput_adjustment_interval``), ``predictor`` (``load_predictor``), ``min_endpoint``,
    ``min_points`` (data points before a model is fitted), ``max_p`` (largest AR order searched)."""

    adjustment_interval_s: float = 180.0
    predictor: Predictor = "arima"
    min_endpoint: int = 1
    min_points: int = 5
    max_p: int = 5
    max_d: int = 2

    def __post_init__(self) -> None:
        if self.predictor not in ("arima", "constant"):
            raise ValueError(f"predictor must be 'arima' or 'constant', got {self.predictor!r}")
        if not self.adjustment_interval_s > 0 or self.min_endpoint < 1 or self.min_points < 1:
            raise ValueError("adjustment_interval_s must be > 0, min_endpoint and min_points >= 1")


class LoadPredictor:
    """One series' next value (module docstring): ``add`` an interval's value, ``predict`` the
    next one. ``kind`` ``"constant"`` predicts the last value."""

    def __init__(
        self, kind: Predictor = "arima", min_points: int = 5, max_p: int = 5, max_d: int = 2
    ) -> None:
        self.kind = kind
        self.min_points = min_points
        self.max_p = max_p
        self.max_d = max_d
        self.values: list[float] = []
        self.order: tuple[int, int, bool] | None = None  # (p, d, log1p space)

    def add(self, value: float) -> None:
        if not math.isfinite(value):
            value = 0.0
        if value == 0 and not any(self.values):
            return  # the idle period before the first traffic is not load
        self.values.append(max(0.0, value))

    def last(self) -> float:
        return self.values[-1] if self.values else 0.0

    def predict(self) -> float:
        values = self.values
        if self.kind == "constant" or len(values) < self.min_points:
            return self.last()
        if min(values) == max(values):
            return values[0]
        if self.order is None:
            self.order = self._choose_order()
        p, d, log_space = self.order
        series = np.log1p(np.asarray(values)) if log_space else np.asarray(values)
        forecast = _arima_forecast(series, p, d)
        if forecast is None:
            return self.last()
        return max(0.0, math.expm1(forecast) if log_space else forecast)

    def _choose_order(self) -> tuple[int, int, bool]:
        raw = np.asarray(self.values)
        p, d = _select_order(raw, self.max_p, self.max_d)
        if p == 0:
            p, d = _select_order(np.log1p(raw), self.max_p, self.max_d)
            return p, d, True
        return p, d, False


def _kpss_stationary(y: np.ndarray) -> bool:
    """KPSS test of level stationarity at 5 % (module docstring)."""
    n = len(y)
    e = y - y.mean()
    variance = float(e @ e) / n
    if variance <= 1e-12 * max(1.0, float(y @ y) / n):
        return True  # a constant series is stationary
    lags = int(4 * (n / 100) ** 0.25)
    long_run = variance
    for lag in range(1, min(lags, n - 1) + 1):
        long_run += 2 * (1 - lag / (lags + 1)) * float(e[lag:] @ e[:-lag]) / n
    if long_run <= 0:
        return True
    partial = np.cumsum(e)
    eta = float(partial @ partial) / (n * n * long_run)
    return eta <= KPSS_CRITICAL_5PCT


def _difference(y: np.ndarray, d: int) -> np.ndarray:
    for _ in range(d):
        y = np.diff(y)
    return y


def _ar_design(w: np.ndarray, p: int, start: int, intercept: bool) -> tuple[np.ndarray, np.ndarray]:
    """Rows t = start..len(w)-1: [1?, w[t-1], ..., w[t-p]] -> w[t]."""
    rows = len(w) - start
    columns = [np.ones(rows)] if intercept else []
    columns += [w[start - lag : len(w) - lag] for lag in range(1, p + 1)]
    x = np.column_stack(columns) if columns else np.zeros((rows, 0))
    return x, w[start:]


def _select_order(y: np.ndarray, max_p: int, max_d: int) -> tuple[int, int]:
    """(p, d): d by KPSS, then the AR order of least AIC over a common sample."""
    d = 0
    while d < max_d and len(y) - d > 3 and not _kpss_stationary(_difference(y, d)):
        d += 1
    w = _difference(y, d)
    intercept = d < 2
    top = max(0, min(max_p, (len(w) - 2 - int(intercept)) // 2))
    best_p, best_aic = 0, math.inf
    for p in range(top + 1):
        x, target = _ar_design(w, p, top, intercept)
        if x.shape[1] >= len(target):
            continue
        if x.shape[1]:
            coef = np.linalg.lstsq(x, target, rcond=None)[0]
            residual = target - x @ coef
        else:
            residual = target
        rss = float(residual @ residual)
        aic = len(target) * math.log(max(rss / len(target), 1e-300)) + 2 * (x.shape[1] + 1)
        if aic < best_aic - 1e-9:
            best_p, best_aic = p, aic
    return best_p, d


def _arima_forecast(y: np.ndarray, p: int, d: int) -> float | None:
    """One step ahead of ARIMA(p, d, 0) fitted by least squares on all of ``y``; None if the
    history is too short for the order."""
    w = _difference(y, d)
    intercept = d < 2
    x, target = _ar_design(w, p, p, intercept)
    if len(target) <= x.shape[1]:
        return None
    coef = np.linalg.lstsq(x, target, rcond=None)[0] if x.shape[1] else np.zeros(0)
    row = ([1.0] if intercept else []) + [float(w[len(w) - lag]) for lag in range(1, p + 1)]
    step = float(np.dot(coef, row)) if row else 0.0
    # Undo the differencing: y[t+1] = w_hat + sum of the last values of each lower difference.
    for order in range(d - 1, -1, -1):
        step += float(_difference(y, order)[-1])
    return step


@dataclass(slots=True)
class _PoolHistory:
    rate: LoadPredictor
    isl: LoadPredictor
    osl: LoadPredictor
    last_isl: float | None = None
    last_osl: float | None = None


@dataclass(slots=True)
class _Observed:
    """One pool's share of the last interval's demand."""

    arrivals: float = 0.0
    input_tokens: float = 0.0
    completed: float = 0.0
    output_tokens: float = 0.0
    start_s: float = math.inf
    end_s: float = -math.inf


class DynamoSlaPlanner:
    """Dynamo's SLA planner per pool (module docstring), with one ``DynamoProfile`` per
    ``(model, version)``; a pool whose model version has no profile is left as it is."""

    name = "dynamo-sla"

    def __init__(
        self,
        profiles: Mapping[tuple[str, str], DynamoProfile],
        params: DynamoSlaParams | None = None,
    ) -> None:
        self.profiles = dict(profiles)
        self.params = params if params is not None else DynamoSlaParams()
        self.interval_s = self.params.adjustment_interval_s
        self._pools: dict[PoolKey, _PoolHistory] = {}
        self._last_now_s: float | None = None

    def plan(self, state: FleetState) -> Plan:
        """Observe, predict and size every planned pool (module docstring)."""
        for pool in state.pools:
            if pool.replicas > 0 and pool.key not in self._pools:
                self._pools[pool.key] = self._history()
        observed = self._observe(state)
        replicas: dict[PoolKey, int] = {}
        reasons: dict[PoolKey, str] = {}
        for key in sorted(self._pools):
            pool = state.pool(*key)
            history = self._pools[key]
            self._record(history, observed.get(key, _Observed()), state.now_s)
            decided = self._size(state, pool, history)
            if decided is None:
                reasons[key] = self._hold_reason(state, key)
                continue
            replicas[key], reasons[key] = decided
        self._last_now_s = state.now_s
        return Plan(replicas=replicas, reasons=reasons)

    def _history(self) -> _PoolHistory:
        p = self.params

        def predictor() -> LoadPredictor:
            return LoadPredictor(p.predictor, p.min_points, p.max_p, p.max_d)

        return _PoolHistory(predictor(), predictor(), predictor())

    def _observe(self, state: FleetState) -> dict[PoolKey, _Observed]:
        """Each planned pool's demand over the last interval (step 1 of the module docstring)."""
        observed: dict[PoolKey, _Observed] = {}
        for sample in state.demand:
            home = (sample.model, sample.version, sample.home_dc)
            if home in self._pools:
                shares = {home: 1.0}
            else:
                shares = _shares([(k, state.pool(*k)) for k in sorted(self._pools) if k[:2] == home[:2]])
            for key, share in shares.items():
                seen = observed.setdefault(key, _Observed())
                seen.arrivals += share * sample.arrivals
                seen.input_tokens += share * sample.input_tokens
                seen.completed += share * sample.completed
                seen.output_tokens += share * sample.output_tokens
                seen.start_s = min(seen.start_s, sample.start_s)
                seen.end_s = max(seen.end_s, sample.end_s)
        return observed

    def _record(self, history: _PoolHistory, seen: _Observed, now_s: float) -> None:
        """Feed one interval to the pool's predictors; an interval of no length (a plan at the
        start of a run) is not an observation."""
        span = seen.end_s - seen.start_s
        if not span > 0:
            last = self._last_now_s
            if last is None or not now_s > last:
                return
            span = now_s - last
        if seen.arrivals > 0:
            history.last_isl = seen.input_tokens / seen.arrivals
        if seen.completed > 0:
            history.last_osl = seen.output_tokens / seen.completed
        history.rate.add(seen.arrivals / span)
        if history.last_isl is not None:
            history.isl.add(history.last_isl)
        if history.last_osl is not None:
            history.osl.add(history.last_osl)

    def _size(self, state: FleetState, pool: PoolState, history: _PoolHistory) -> tuple[int, str] | None:
        """(replicas, reason) for one pool, or None when it cannot be sized yet."""
        profile = self.profiles.get((pool.model, pool.version))
        spec = state.model_spec(pool.model, pool.version)
        if profile is None or spec is None or not history.isl.values or not history.osl.values:
            return None
        rate = history.rate.predict()
        isl = max(history.isl.predict(), 1.0)
        osl = max(history.osl.predict(), 1.0)
        prefill = profile.prefill_throughput(isl)
        context = isl + osl / 2
        decode = profile.decode_throughput(context)
        prefill_need = rate * isl / prefill
        decode_need = rate * osl / decode
        same_model = sum(1 for k in self._pools if k[:2] == pool.key[:2])
        floor = max(self.params.min_endpoint, math.ceil(spec.min_replicas / same_model))
        gpus = next((dc.gpus for dc in state.dcs if dc.name == pool.dc), None)
        ceiling = gpus // max(spec.gpus, 1) if gpus is not None else math.inf
        wanted = max(math.ceil(prefill_need + decode_need), floor)
        replicas = int(max(min(wanted, ceiling), floor))
        ttft = profile.prefill_ttft(isl)
        unmet = (
            f" (TTFT alone {ttft:.2f} s over its {profile.ttft_s:g} s target)"
            if ttft > profile.ttft_s
            else ""
        )
        reason = (
            f"dynamo-sla: predicted ({self.params.predictor}) {rate:.3f} req/s, isl {isl:.0f}, "
            f"osl {osl:.0f}; prefill {prefill:.0f} tok/s per replica{unmet} -> {prefill_need:.2f}; "
            f"decode {decode:.0f} tok/s at ITL {profile.itl_s:g} s, context {context:.0f} -> "
            f"{decode_need:.2f}; ceil(sum) {math.ceil(prefill_need + decode_need)}, floor {floor}, "
            f"budget {ceiling} -> {replicas}"
        )
        return replicas, reason

    def _hold_reason(self, state: FleetState, key: PoolKey) -> str:
        if (key[0], key[1]) not in self.profiles:
            return "dynamo-sla: no profile of this model version; the pool keeps its size"
        if state.model_spec(key[0], key[1]) is None:
            return "dynamo-sla: no model spec for this pool; it keeps its size"
        return "dynamo-sla: no request observed yet; the pool keeps its size"


def _shares(pools: Sequence[tuple[PoolKey, PoolState]]) -> dict[PoolKey, float]:
    """Fractions of a demand with no pool in its home DC: by the pools' replicas, else equal."""
    if not pools:
        return {}
    total = sum(pool.replicas for _, pool in pools)
    if total == 0:
        return {key: 1 / len(pools) for key, _ in pools}
    return {key: pool.replicas / total for key, pool in pools}


__all__ = ["DynamoProfile", "DynamoSlaParams", "DynamoSlaPlanner", "LoadPredictor"]
