"""Busy windows: the rows ``sim/engine/calibration.py`` fits an engine group's step-time law to,
rebuilt per instance from what the store keeps of its attempts.

What the store keeps of every ended attempt (``Observations``) is enough to rebuild, per
instance, when each request prefilled and decoded: attempt j arrived at a_j, its client saw its
first token at a_j + TTFT_j and its end at a_j + E2E_j when it ended ok (else at its completion's
time), each the law's delay ``token_delay_s`` (delta) after the step that made it ended, so the
engine made its first token at f_j = a_j + TTFT_j - delta and generated o_j tokens until e_j (its
end less delta; neither earlier than the arrival); the u_j = n_j - k_j uncached tokens of its
prompt (at least 1) were computed by the step ending at f_j and, when more than a step holds, by
steps before it; its o_j - 1 later tokens by the steps ending in (f_j, e_j].

The busy-window identity. While an instance is busy its steps follow one another, so the length
of a window it is busy throughout is the sum of its steps' durations; by the law of
``sim/engine/profiles.py`` (nominal for L infinite)::

    t2 - t1 = T0*N + a*P + b*(Q + Q2/L) + c*D + d*(E + E2/L)

over the steps of (t1, t2]: N steps, P prefill tokens, Q = sum P_new*m and Q2 = sum P_new*m*m
(m = n_ctx + P_new/2, per chunk), D decode tokens (one per decoder per step: the sum of the batch
sizes), E and E2 the sums of their contexts and of their squares. Each attempt gives one or two
such windows (rows):
- TTFT row, (a_i, f_i]: the steps it waited for (the queue ahead of it included) and its own
  prefill; no model of the queue is needed, the window holds it. TTFT_i = delta + the law over
  the window;
- TPOT row (ended ok, two tokens or more), (f_i, e_i]: N = o_i - 1 exactly; its length is the
  observed one (delta moves both ends).

The delay in a TTFT row. Rebuilt with delta_k, the rows hold delta_k; a delta other than it
moves the steps under way when the request arrived by delta_k - delta against its arrival (those
that began with it or later stay after it), so a window that opened on a busy engine gains (or
loses) delta_k - delta seconds of steps, and one that opened on an idle engine keeps its steps.
To first order in delta,

    TTFT_i = law(x_i) + delta*(1 - rho_i) + delta_k*rho_i

with rho_i = 1 where steps were under way just before a_i, else 0 (``WindowRows.delay_factor``
= 1 - rho_i): a window that opened on a busy engine does not tell the delay (its steps fill it
whatever the delay), one that opened on an idle engine does, and so does one that a delay
longer than its TTFT left empty (rho_i = 0: it is all delay). (Counting the law's time of the
steps under way instead, rho_i < 1 wherever the law is too fast, and the delay would make up
the law's misfit.)

The window quantities are integrals of work *densities* rebuilt per instance (``_Timeline``;
integrated exactly over any window, so a step under way at a_i counts by its part inside):
- prefill steps (``_prefill_steps``): one ends at each distinct first-token time. The prompts
  are one stream of tokens, computed in the order their first tokens came; a step computes up
  to ``prefill_budget_tokens`` less its decoders' tokens of it: what is left of the prompts
  ending with it (in steps of a full budget before it when one cannot hold that), and the rest
  of its budget goes to the next prompt in line if that one was waiting when the step started
  (vLLM's chunked prefill). A step lasts what the law says of it (at the current estimate) and
  spreads its P, Q, Q2 and its one step evenly over that time, starting no earlier than the
  step before it nor than the arrival of a prompt it begins; the steps of a long prompt run back
  to back from when it could start to its first token, and share that time as the law says;
- decoders: every decoder makes one token in each prefill step during its decode, and the rest
  at the pace of decode-only steps: 1 / (T0 + c*B + d*(C + C2/L)) at the current estimate (B
  decoders then, their contexts summing to C, their squares to C2), then ``PACE_ROUNDS`` times
  rescaled, each stretch of time by the mean (geometric) ratio of its decoders' tokens to what
  the pace gives them, and each decoder's share scaled so that it makes exactly o_j - 1; its context
  grows evenly from n_j.

The current estimate is the ``law`` that ``window_rows`` is given: where steps lie depends on
it, so the fit (``sim/engine/calibration.py``) rebuilds the rows with each new estimate.

Times known to +-1 ms. The store keeps arrivals to the millisecond (ClickHouse DateTime64(3),
truncated) and durations exactly, so an attempt's first-token and end times (arrival + TTFT,
arrival + E2E) are early by its arrival's lost fraction, under 1 ms, which differs from one
attempt to the next. The rebuild does not let that reorder anything: times less than
``SAME_STEP_S`` apart (first tokens and ends alike; steps last longer than that) are the end of
one step and all move to the latest of them (``_step_ends``); within one step the prompts are
taken in the order they arrived, whatever their rounded first tokens say; whether the next
prompt joins a step compares its arrival with that step's start, which the law (attention at
the chunk's context included) places from the step's end.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from sim.engine.attempt import Attempt
from sim.engine.profiles import EngineProfile

TERMS = (
    "t0_s",
    "prefill_s_per_token",
    "prefill_s_per_token_pair",
    "decode_s_per_seq",
    "decode_s_per_context_token",
)
"""The law's terms (``EngineProfile`` fields): T0, a, b, c, d."""

PACE_ROUNDS = 5
"""Rounds that fit the pace of decode-only steps to every decoder's count at once."""
SAME_STEP_S = 1e-3
"""Step ends closer than this are one (the store keeps arrivals to the millisecond)."""


@dataclass(frozen=True, slots=True, eq=False)
class Observations:
    """The ended attempts of one engine group, one entry per attempt (numpy arrays of one
    length): ``instance`` (its id), ``arrival_s``, ``ttft_s``, ``tpot_s``, ``e2e_s`` (seconds;
    NaN: not taken), ``end_s`` (its completion's time, on the arrivals' clock), the tokens
    ``input_tokens``, ``cached_tokens`` and ``output_tokens``, and ``ok`` (ended with status ok)."""

    instance: np.ndarray
    arrival_s: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    end_s: np.ndarray
    input_tokens: np.ndarray
    cached_tokens: np.ndarray
    output_tokens: np.ndarray
    ok: np.ndarray

    @classmethod
    def of(cls, **columns: Any) -> Observations:
        """From sequences (None in a float column: NaN); ``ValueError`` if lengths differ."""
        kinds: dict[str, type] = {"instance": str, "ok": bool}
        kinds.update(dict.fromkeys(("input_tokens", "cached_tokens", "output_tokens"), np.int64))
        arrays: dict[str, np.ndarray] = {
            f.name: np.asarray(columns[f.name], dtype=kinds.get(f.name, float)) for f in fields(cls)
        }
        if len({len(a) for a in arrays.values()}) > 1:
            raise ValueError("observation columns differ in length")
        return cls(**arrays)

    def __len__(self) -> int:
        return len(self.arrival_s)

    def subset(self, mask: np.ndarray) -> Observations:
        return Observations(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    def in_order(self) -> Observations:
        """The attempts by instance, arrival, TTFT, E2E, end and tokens: one order whatever
        order the store returned them in. Arrivals are kept to the millisecond, so several
        attempts can share one, and the rebuild (and so the fit) must not depend on which of
        them the store listed first."""
        keys = (self.output_tokens, self.cached_tokens, self.input_tokens, self.end_s, self.e2e_s)
        order = np.lexsort((*keys, self.ttft_s, self.arrival_s, self.instance))
        return self.subset(order)


def observations_from_attempts(attempts: Iterable[Attempt]) -> Observations:
    """What the store would hold of a simulated run's attempts that reached an instance and
    ended (arrivals truncated to the millisecond, as the store keeps them)."""
    columns: dict[str, list[Any]] = {f.name: [] for f in fields(Observations)}
    for a in attempts:
        if a.instance is None or a.end_s is None:
            continue
        arrival = math.floor(a.arrival_s * 1000) / 1000
        first = a.first_token_s
        row = {
            "instance": a.instance.spec.instance_id,
            "arrival_s": arrival,
            "ttft_s": math.nan if first is None else first - arrival,
            "tpot_s": math.nan if first is None or a.generated < 2 else (a.end_s - first) / (a.generated - 1),
            "e2e_s": a.end_s - arrival if a.status == "ok" else math.nan,
            "end_s": a.end_s,
            "input_tokens": a.request.input_tokens,
            "cached_tokens": a.cached_tokens,
            "output_tokens": a.generated,
            "ok": a.status == "ok",
        }
        for key, value in row.items():
            columns[key].append(value)
    return Observations.of(**columns)


@dataclass(frozen=True, slots=True)
class StepLaw:
    """The law's terms (``TERMS`` order), 1/L (0: the nominal law) and the delay from a step to
    its client seeing its tokens (``EngineProfile.token_delay_s``)."""

    theta: np.ndarray
    inverse_growth: float = 0.0
    token_delay_s: float = 0.0

    @classmethod
    def of(cls, profile: EngineProfile) -> StepLaw:
        growth = profile.attention_growth_tokens
        return cls(
            np.array([getattr(profile, t) for t in TERMS], dtype=float),
            1 / growth if growth > 0 else 0.0,
            profile.token_delay_s,
        )

    def design(self, x: np.ndarray) -> np.ndarray:
        return term_factors(x, self.inverse_growth)

    def predict(self, rows: WindowRows) -> np.ndarray:
        """Each row's observed length as the law predicts it (a TTFT row's with the delay, to
        first order about the delay the rows were rebuilt with: module docstring)."""
        delay = self.token_delay_s * rows.delay_factor + rows.delay_s * (rows.ttft - rows.delay_factor)
        lengths: np.ndarray = self.design(rows.x) @ self.theta + delay
        return lengths


def term_factors(x: np.ndarray, inverse_growth: float) -> np.ndarray:
    """The rows' seven window quantities (N, P, Q, Q2, D, E, E2) as the five terms' factors."""
    g = inverse_growth
    return np.column_stack([x[:, 0], x[:, 1], x[:, 2] + g * x[:, 3], x[:, 4], x[:, 5] + g * x[:, 6]])


@dataclass(frozen=True, slots=True)
class WindowRows:
    """Busy windows, one entry per row (module docstring): ``covered_s``, the time their windows
    cover, each instance's apart (the length of their union); ``delay_s``, the delay they were
    rebuilt with."""

    x: np.ndarray  # (rows, 7): N, P, Q, Q2, D, E, E2 of each window
    y: np.ndarray  # each window's observed length (s)
    ttft: np.ndarray  # True: a TTFT row; False: a TPOT row
    delay_factor: np.ndarray  # a TTFT row's 1 - rho (module docstring); 0 for a TPOT row
    covered_s: float = 0.0
    delay_s: float = 0.0

    @property
    def overlap(self) -> float:
        """How many windows cover an instant of the time they cover, on the mean (at least 1):
        windows that overlap share the steps within, and the noise of those steps."""
        return max(float(self.y.sum()) / self.covered_s, 1.0) if self.covered_s > 0 else 1.0

    def subset(self, mask: np.ndarray) -> WindowRows:
        """The rows of ``mask``, their windows' overlap taken as all rows' (``covered_s`` scaled)."""
        total = float(self.y.sum())
        share = float(self.y[mask].sum()) / total if total > 0 else 0.0
        kept = (self.x[mask], self.y[mask], self.ttft[mask], self.delay_factor[mask])
        return WindowRows(*kept, self.covered_s * share, self.delay_s)


def window_rows(observations: Observations, law: StepLaw, budget: int) -> WindowRows:
    """The TTFT and TPOT rows of every instance's attempts (module docstring), rebuilt with
    ``law`` and a prefill budget of ``budget`` tokens per step; instance by instance, each in
    ``Observations.in_order``."""
    observations = observations.in_order()
    parts = [
        _instance_rows(observations.subset(observations.instance == instance), law, budget)
        for instance in np.unique(observations.instance)
    ]
    if not parts:
        return WindowRows(np.zeros((0, 7)), np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0))
    x, y, ttft, factor = (
        np.concatenate([getattr(p, f) for p in parts]) for f in ("x", "y", "ttft", "delay_factor")
    )
    return WindowRows(x, y, ttft, factor, sum(p.covered_s for p in parts), law.token_delay_s)


def _instance_rows(obs: Observations, law: StepLaw, budget: int) -> WindowRows:
    """The TTFT and TPOT rows of one instance's attempts (times from its first arrival, so
    that powers of times stay exact)."""
    origin = np.nanmin(obs.arrival_s)
    arrival = obs.arrival_s - origin
    first = np.isfinite(obs.ttft_s) & (obs.ttft_s > 0)
    seen = np.where(first, arrival + np.nan_to_num(obs.ttft_s), np.nan)
    ended = obs.ok & np.isfinite(obs.e2e_s)
    seen_end = np.where(ended, arrival + np.nan_to_num(obs.e2e_s), obs.end_s - origin)
    seen, seen_end = np.split(_step_ends(np.concatenate([seen, seen_end])), 2)
    # When the engine made them (module docstring); fmax: NaN where no first token came.
    token = np.fmax(seen - law.token_delay_s, np.where(first, arrival, np.nan))
    end = np.fmax(seen_end - law.token_delay_s, np.fmax(token, arrival))
    decodes = first & (obs.output_tokens >= 2) & (end > token)
    timeline = _Timeline(
        token[decodes], end[decodes], obs.input_tokens[decodes], obs.output_tokens[decodes] - 1
    )
    uncached = np.maximum(obs.input_tokens - obs.cached_tokens, 1)
    prompts = (arrival[first], token[first], uncached[first], (obs.input_tokens - uncached)[first])
    timeline.place_prefill(*prompts, law, budget)
    tpot = decodes & obs.ok
    tpot_x = timeline.window(token[tpot], end[tpot])
    tpot_x[:, 0] = obs.output_tokens[tpot] - 1  # a decoding attempt makes one token per step
    x = np.vstack([timeline.window(arrival[first], token[first]), tpot_x])
    starts = np.concatenate([arrival[first], seen[tpot]])
    y = np.concatenate([seen[first] - arrival[first], seen_end[tpot] - seen[tpot]])
    busy = timeline.density(arrival[first])[:, 0] > 0  # steps under way: rho = 1
    busy[token[first] <= arrival[first]] = False  # an empty window: the delay is all of it
    factor = np.concatenate([~busy, np.zeros(int(tpot.sum()), dtype=bool)]).astype(float)
    ttft = np.arange(len(y)) < int(first.sum())
    return WindowRows(x, y, ttft, factor, _union_s(starts, starts + y), law.token_delay_s)


class _Timeline:
    """One instance's work densities (module docstring): decoders given at construction
    (``start``, ``end``, ``prompt`` and the ``tokens`` made after the first), prefill steps by
    ``place_prefill``; ``window`` integrates them."""

    def __init__(self, start: np.ndarray, end: np.ndarray, prompt: np.ndarray, tokens: np.ndarray) -> None:
        self._start, self._end, self._tokens = start, end, tokens
        growth = tokens / (end - start)
        base = prompt - growth * start  # its context at time t: base + growth*t
        # Per decoder: 1, and the coefficients of its context and of its context's square.
        self._decoder = np.column_stack(
            [np.ones_like(growth), base, growth, base * base, base * growth, growth**2]
        )
        self._grid, self._state = _sweep(np.concatenate([start, end]), _opening(self._decoder))

    def decoders_at(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The number of decoders just before ``t``, the sum of their contexts and of squares."""
        count, base, growth, base2, cross, growth2 = self._state[
            np.searchsorted(self._grid, t, side="left")
        ].T
        return count, base + growth * t, base2 + 2 * cross * t + growth2 * t * t

    def place_prefill(
        self,
        arrival: np.ndarray,
        token: np.ndarray,
        uncached: np.ndarray,
        cached: np.ndarray,
        law: StepLaw,
        budget: int,
    ) -> None:
        """Place the prefill steps of the prompts that got their first token at ``token``
        (``_prefill_steps``), then the decoders' tokens around them."""
        steps = _prefill_steps(arrival, token, uncached, cached, law, budget, self.decoders_at)
        self._build(steps, law)

    def _build(self, steps: np.ndarray, law: StepLaw) -> None:
        """The densities on the grid of every decoder's and prefill step's start and end."""
        span = steps[:, 1] - steps[:, 0]
        per_step = np.column_stack([np.ones(len(span)), 1 / span, *(steps[:, k] / span for k in (2, 3, 4))])
        times = np.concatenate([self._start, self._end, steps[:, 0], steps[:, 1]])
        order = np.argsort(times, kind="stable")
        grid = times[order]
        opened = 2 * len(self._start)
        deltas = np.zeros((len(times), 11))
        deltas[:opened, :6] = _opening(self._decoder)
        deltas[opened:, 6:] = _opening(per_step)
        state = np.cumsum(deltas[order], axis=0)
        count, base, growth, base2, cross, growth2, inside, rate, p, q, q2 = state.T
        ramp = inside > 0.5  # within a prefill step: every decoder makes one token
        middle = (grid + np.append(grid[1:], grid[-1:])) / 2 if len(grid) else grid
        contexts = base + growth * middle
        squares = base2 + 2 * cross * middle + growth2 * middle * middle
        theta, g = law.theta, law.inverse_growth
        law_s = theta[0] + theta[3] * count + theta[4] * (contexts + g * squares)
        pace = np.where(ramp, 0.0, 1 / np.maximum(law_s, 1e-9))  # decode-only steps per second
        zero = np.zeros((len(grid), 1))
        in_steps = _cumulative(grid, rate[:, None], zero, zero, self._start, self._end)[:, 0]
        left = np.maximum(self._tokens - in_steps, 0)
        for _ in range(PACE_ROUNDS):  # each segment's pace times the mean ratio of its decoders
            paced = _cumulative(grid, pace[:, None], zero, zero, self._start, self._end)[:, 0]
            fits = (paced > 1e-12) & (left > 0)
            log_ratio = np.where(fits, np.log(np.maximum(left, 1e-12) / np.maximum(paced, 1e-12)), 0.0)
            per = np.zeros(len(times))
            per[:opened] = np.concatenate([log_ratio, -log_ratio])
            pace = pace * np.exp(np.where(count > 0.5, np.cumsum(per[order]) / np.maximum(count, 1.0), 0.0))
        paced = _cumulative(grid, pace[:, None], zero, zero, self._start, self._end)[:, 0]
        share = np.where(paced > 1e-12, left / np.maximum(paced, 1e-12), 0.0)
        shares = np.zeros((len(times), 6))
        shares[:opened] = _opening(self._decoder * share[:, None])
        s_count, s_base, s_growth, s_base2, s_cross, s_growth2 = np.cumsum(shares[order], axis=0).T

        def by_phase(in_ramp: np.ndarray, outside: np.ndarray) -> np.ndarray:
            density: np.ndarray = np.where(ramp, rate * in_ramp, pace * outside)
            return density

        steps_made = np.where(ramp, rate, pace * s_count / np.maximum(count, 1.0))
        constant = [
            steps_made,
            p,
            q,
            q2,
            by_phase(count, s_count),
            by_phase(base, s_base),
            by_phase(base2, s_base2),
        ]
        linear = [*([np.zeros(len(grid))] * 5), by_phase(growth, s_growth), by_phase(2 * cross, 2 * s_cross)]
        square = [*([np.zeros(len(grid))] * 6), by_phase(growth2, s_growth2)]
        self._grid = grid
        self._c0, self._c1, self._c2 = (np.column_stack(c) for c in (constant, linear, square))

    def window(self, t1: np.ndarray, t2: np.ndarray) -> np.ndarray:
        """N, P, Q, Q2, D, E, E2 over (t1, t2], one row per window."""
        return _cumulative(self._grid, self._c0, self._c1, self._c2, t1, t2)

    def density(self, t: np.ndarray) -> np.ndarray:
        """N, P, Q, Q2, D, E, E2 per second just before each time of ``t`` (0 outside the grid)."""
        if not len(self._grid):
            return np.zeros((len(t), 7))
        k = np.searchsorted(self._grid, t, side="left") - 1
        inside = (k >= 0) & (k < len(self._grid) - 1)
        k = np.clip(k, 0, len(self._grid) - 1)
        rates = self._c0[k] + self._c1[k] * t[:, None] + self._c2[k] * (t * t)[:, None]
        density: np.ndarray = np.where(inside[:, None], rates, 0.0)
        return density


def _prefill_steps(
    arrival: np.ndarray,
    token: np.ndarray,
    uncached: np.ndarray,
    cached: np.ndarray,
    law: StepLaw,
    budget: int,
    decoders_at: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> np.ndarray:
    """One instance's prefill steps as rows (start, end, P, Q, Q2), in time order (module
    docstring)."""
    if len(token) == 0:
        return np.zeros((0, 5))
    # The first tokens of one step are one time (``_step_ends``): within a step, the prompts in
    # the order the engine took them, that of their arrivals.
    order = np.lexsort((arrival, token))
    arrival, token, uncached, cached = arrival[order], token[order], uncached[order], cached[order]
    stream = np.cumsum(uncached).astype(float)  # where each prompt ends in the stream of tokens
    begins = stream - uncached
    group = np.concatenate([[0], np.cumsum(np.diff(token) > 0)])
    bounds = np.flatnonzero(np.diff(group, prepend=-1))
    last = np.append(bounds[1:], len(token)) - 1  # the last prompt of each group
    ends = np.maximum.reduceat(token, bounds)
    count, contexts, squares = decoders_at(ends)
    room = np.maximum(budget - count, 1.0)
    theta, g = law.theta, law.inverse_growth
    decode_s = theta[0] + theta[3] * count + theta[4] * (contexts + g * squares)
    chunk_s = _StreamLaw(stream, cached, law).seconds
    edge, at = _step_bounds(stream, last, room, arrival, ends - decode_s, chunk_s)
    # Each step computes the pieces of prompts between its bounds: one chunk of each.
    cuts = np.union1d(edge, np.concatenate([[0.0], stream]))
    lo, hi = cuts[:-1], cuts[1:]
    prompt = np.searchsorted(stream, lo, side="right")
    step = np.searchsorted(edge, lo, side="right") - 1
    size = hi - lo
    position = cached[prompt] + (lo - begins[prompt]) + size / 2
    p = np.bincount(step, size, len(at))
    q = np.bincount(step, size * position, len(at))
    q2 = np.bincount(step, size * position * position, len(at))
    duration = decode_s[at] + theta[1] * p + theta[2] * (q + g * q2)
    begun = np.full(len(p), -np.inf)  # the latest arrival of a prompt a step begins
    np.maximum.at(begun, np.searchsorted(edge, begins, side="right") - 1, arrival)
    first_step = np.flatnonzero(np.diff(at, prepend=-1))
    # A group of several steps (a long prompt) runs them back to back from when it could start
    # (the group before it done, its prompt arrived) to its first-token time: the law only
    # shares that time out among them.
    opens = np.maximum(np.concatenate([[-np.inf], ends[:-1]]), begun[first_step])
    several = np.bincount(at) > 1
    span, lawful = ends - opens, np.bincount(at, duration)
    duration = duration * np.where(several & (span > 0), span / np.maximum(lawful, 1e-12), 1.0)[at]
    # A group's steps end one after another, the last at the group's first-token time.
    after = np.cumsum(duration[::-1])[::-1] - duration
    last_step = np.append(first_step[1:], len(at)) - 1
    step_end = ends[at] - (after - after[last_step][at])
    previous = np.concatenate([[-np.inf], step_end[:-1]])
    start = np.minimum(np.maximum.reduce([step_end - duration, begun, previous]), step_end - 1e-6)
    return np.column_stack([start, step_end, p, q, q2])


def _step_bounds(
    stream: np.ndarray,
    last: np.ndarray,
    room: np.ndarray,
    arrival: np.ndarray,
    prefill_from: np.ndarray,
    chunk_s: Callable[[float, float], float],
) -> tuple[np.ndarray, np.ndarray]:
    """The prefill steps' bounds in the stream of prompt tokens (one more than steps) and the
    group each step ends with: group k ends when the stream reaches ``stream[last[k]]``, in
    steps of ``room[k]`` tokens at most; the prompt after it takes the rest of its last step if
    it arrived before that step began (``prefill_from[k]``, the group's end less its decode
    terms, less the prefill terms of the step's tokens: ``chunk_s(lo, hi)`` for the stream's
    tokens lo to hi, attention at their context included)."""
    # Python floats in the loop: the same doubles, without numpy's per-scalar overhead.
    ends, lasts, rooms = stream.tolist(), last.tolist(), room.tolist()
    arrivals, froms = arrival.tolist(), prefill_from.tolist()
    edges, owner = [0.0], []
    for k, (at, space) in enumerate(zip(lasts, rooms, strict=True)):
        upto = ends[at]
        extra = max(math.ceil((upto - edges[-1]) / space) - 1, 0)
        edges += [edges[-1] + space * (i + 1) for i in range(extra)]
        done = max(upto, edges[-1])
        take = min(space - (done - edges[-1]), ends[at + 1] - done) if at + 1 < len(ends) else 0.0
        began = froms[k] - chunk_s(edges[-1], done + take)
        edges.append(done + take if take > 0 and arrivals[at + 1] < began else done)
        owner += [k] * (extra + 1)
    return np.array(edges), np.array(owner, dtype=int)


class _StreamLaw:
    """The prefill terms of the law for a stretch of the stream of prompt tokens (``stream``:
    where each prompt ends in it; ``cached``: each prompt's tokens already in the KV cache)."""

    def __init__(self, stream: np.ndarray, cached: np.ndarray, law: StepLaw) -> None:
        self._ends = stream.tolist()
        self._cached = cached.tolist()
        self._a, self._b = float(law.theta[1]), float(law.theta[2])
        self._g = law.inverse_growth

    def seconds(self, lo: float, hi: float) -> float:
        """a*P + b*(Q + Q2/L) of the stream's tokens lo to hi, one chunk per prompt."""
        total = 0.0
        prompt = bisect_right(self._ends, lo)
        while lo < hi and prompt < len(self._ends):
            begin = self._ends[prompt - 1] if prompt else 0.0
            size = min(hi, self._ends[prompt]) - lo
            position = self._cached[prompt] + (lo - begin) + size / 2
            total += size * (self._a + self._b * position * (1 + self._g * position))
            lo += size
            prompt += 1
        return total


def _union_s(starts: np.ndarray, ends: np.ndarray) -> float:
    """The length of the union of the intervals (starts, ends]."""
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(np.concatenate([[-np.inf], ends]))[:-1]  # the latest end before
    return float(np.maximum(ends - np.maximum(starts, reach), 0.0).sum())


def _step_ends(times: np.ndarray) -> np.ndarray:
    """Each time (NaN: none) moved to the latest of its run of times less than ``SAME_STEP_S``
    apart: the ends of one step, apart only by the store's rounding of arrivals."""
    result = times.copy()
    order = np.flatnonzero(np.isfinite(times))
    order = order[np.argsort(times[order], kind="stable")]
    run = np.cumsum(np.diff(times[order], prepend=-np.inf) > SAME_STEP_S) - 1
    latest = np.full(int(run[-1]) + 1 if len(run) else 0, -np.inf)
    np.maximum.at(latest, run, times[order])
    result[order] = latest[run]
    return result


def _opening(per: np.ndarray) -> np.ndarray:
    """The deltas of intervals that open with ``per`` (the first half) and close (the second)."""
    return np.vstack([per, -per])


def _sweep(times: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Event times in order and the running sums after each (row 0: before any event)."""
    order = np.argsort(times, kind="stable")
    state = np.cumsum(deltas[order], axis=0)
    return times[order], np.vstack([np.zeros((1, deltas.shape[1])), state])


def _cumulative(
    grid: np.ndarray, c0: np.ndarray, c1: np.ndarray, c2: np.ndarray, t1: np.ndarray, t2: np.ndarray
) -> np.ndarray:
    """Integrals over (t1, t2] of densities c0 + c1*t + c2*t*t, their coefficients constant on
    each [grid[k], grid[k+1]) (one column per density; zero before the grid)."""
    if len(grid) == 0:
        return np.zeros((len(t1), c0.shape[1]))

    def area(k: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The integral from a to b (within segment k)."""
        mean = c0[k] + c1[k] * ((a + b) / 2)[:, None] + c2[k] * ((a * a + a * b + b * b) / 3)[:, None]
        integral: np.ndarray = (b - a)[:, None] * mean
        return integral

    segments = np.arange(len(grid) - 1)
    total = np.vstack([np.zeros((1, c0.shape[1])), np.cumsum(area(segments, grid[:-1], grid[1:]), axis=0)])

    def upto(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(grid, t, side="right") - 1
        inside = np.maximum(k, 0)
        value = total[inside] + area(inside, grid[inside], np.maximum(t, grid[inside]))
        result: np.ndarray = np.where((k >= 0)[:, None], value, 0.0)
        return result

    difference: np.ndarray = upto(t2) - upto(t1)
    return difference
