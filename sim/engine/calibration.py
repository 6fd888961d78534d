"""Calibration: fit an engine group's step-time law to what its instances recorded.

The rows. Each attempt gives one or two busy windows (a TTFT row, a TPOT row), whose length the
law predicts from the work its instance did in them (N steps, the prefill quantities P, Q, Q2 and
the decode ones D, E, E2): ``sim/engine/busy_windows.py`` rebuilds that work per instance from
the store's ``Observations`` (the busy-window identity and the rebuild: its module docstring).
Where steps lie depends on the law the rows are rebuilt with, so the fit alternates until that
law settles (no term moved by more than ``CONVERGED``, at most ``ITERATIONS`` rounds): rebuild
the rows (with the prior first), fit them all, and rebuild next with the law fitted to the TPOT
rows alone, the terms they cannot pin at the all-rows fit's values; the result is the all-rows
fit at the settled rows. Why the TPOT rows: both ends of a TPOT window are step ends (a first
token, a last token), so each step lies whole inside it or outside, and its N is exact; where
the rebuild puts a step's start does not change them. A TTFT window opens at an arrival, in
the middle of the work: its content follows the placement, and a placement from a wrong law
agrees with that law (a prefill step placed too short leaves room for decode-only steps that
make up the difference), so a fit of all rows moves only a little way from the law it was
rebuilt with in each round.

The fit. Each row is divided by its observed length floored at ``WINDOW_FLOOR_S`` (the root of
the sum of their squares): residuals are relative errors, but not on the shortest windows, whose
lengths the store's millisecond (``sim/engine/busy_windows.py``) leaves a few per cent
uncertain. Each term is scaled by the prior's value (the unknowns are multipliers of the prior),
then solved by non-negative least squares, for L infinite (the nominal law) and for each length
of ``GROWTH_LENGTHS``; a finite L (the perturbed law's attention growth) is kept only when it
lowers the residual sum of squares by ``MIN_GROWTH_GAIN`` or more. A term the data cannot pin
keeps the prior's value, and the result says so (``Calibration.messages``): one whose standard
error (least squares, the other free terms beside it) exceeds ``MAX_STANDARD_ERROR`` of the
prior's value -- ``b`` without long prompts, ``c`` when the batch hardly varies; the worst is
fixed first, then the rest assessed again. Residual error: the relative RMS of the rows'
predictions against what was observed, TTFT and TPOT apart, at the fitted law (and at the
prior's, for comparison). Engine noise, pre-emptions and requests that left before their first
token are not rebuilt: they show as residual error.

Capacity, from the heartbeats (``HeartbeatSummary``): ``kv_tokens`` = the largest
``kv_blocks_total`` times the block size; ``max_seqs`` = the most requests seen running, if that
exceeds the prior's, or if ``SEAT_LIMIT_BEATS`` heartbeats or more saw that many running while
others waited and the KV cache had room (the engine's seat limit); else the prior's. The fitted
profile has no noise; its other fields are the prior's.

Followed: the time-integrated exposures and non-negative least squares of BLIS's trace-only
estimator (inference-sim/blis, ``python/estimators/baseline.py``, commit 087bb0a), and its
README's iterative step-density reweighting; here with attention terms, TTFT windows that hold
the queue, chunked prefill rebuilt as vLLM schedules it, and a prior for what the data cannot pin.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from agents.policy.types import BLOCK_TOKENS
from sim.engine.attempt import Attempt
from sim.engine.busy_windows import TERMS, Observations, StepLaw, WindowRows, term_factors, window_rows
from sim.engine.profiles import PROFILES, EngineProfile

_WHY_NOT = {
    "t0_s": "steps too alike to part the fixed cost from the batch's",
    "prefill_s_per_token": "too little prefill",
    "prefill_s_per_token_pair": "no long prompts",
    "decode_s_per_seq": "batch sizes too alike",
    "decode_s_per_context_token": "decode contexts too alike",
}
ITERATIONS = 12
CONVERGED = 0.002
"""The fit stops after ``ITERATIONS`` rounds, or when no term moved by more than this share."""
MAX_STANDARD_ERROR = 0.5
"""A term is fitted when its standard error is at most this share of the prior's value."""
GROWTH_LENGTHS = tuple(4096.0 * 2**k for k in range(8))
"""The attention growth lengths L tried beside the nominal law (tokens)."""
MIN_GROWTH_GAIN = 0.02
"""A finite L is kept when it lowers the residual sum of squares by at least this share."""
MIN_ROWS = 10
"""Fewest TTFT rows, and TPOT rows, to fit anything."""
SEAT_LIMIT_BEATS = 3
WINDOW_FLOOR_S = 0.02
"""Rows weigh as relative errors of windows at least this long (module docstring)."""
_SCALE = np.array([getattr(PROFILES["llama3-8b-h100"], term) for term in TERMS])
"""Units of a term whose prior is 0 (for the multipliers and their standard errors)."""


@dataclass(frozen=True, slots=True)
class HeartbeatSummary:
    """What a group's heartbeats say of its capacity: the largest ``kv_blocks_total`` (0: no
    heartbeat), the most requests seen ``running``, and how many beats saw that many running
    while others waited and KV blocks were free (``beats_at_seat_limit``)."""

    kv_blocks_total: int = 0
    max_running: int = 0
    beats_at_seat_limit: int = 0


@dataclass(frozen=True, slots=True)
class Calibration:
    """A fitted profile, its rows, its residual errors (relative RMS; None: no rows) beside the
    prior's, the terms kept at the prior's value, and what to tell the user."""

    profile: EngineProfile
    ttft_rows: int
    tpot_rows: int
    ttft_error: float | None
    tpot_error: float | None
    prior_ttft_error: float | None
    prior_tpot_error: float | None
    kept: tuple[str, ...]
    messages: tuple[str, ...]


def calibrate(
    observations: Observations,
    prior: EngineProfile,
    heartbeats: HeartbeatSummary | None = None,
    name: str | None = None,
) -> Calibration:
    """Fit ``prior``'s law to ``observations`` (module docstring); the profile is named
    ``name`` (default: the prior's)."""
    start = law = StepLaw.of(prior)
    budget = prior.prefill_budget_tokens
    rows = window_rows(observations, law, budget)
    prior_errors = _errors(rows, law)
    kept: tuple[str, ...] = TERMS
    messages: list[str] = []
    counts = int(rows.ttft.sum()), int((~rows.ttft).sum())
    if min(counts) < MIN_ROWS:
        messages.append(
            f"only {counts[0]} attempts with a first token and {counts[1]} ended ok with two tokens or "
            f"more: too few to fit (at least {MIN_ROWS} each); the prior's law kept"
        )
    else:
        law, kept, reasons, rows = _settle(observations, start, budget, rows)
        messages += reasons
    errors = _errors(rows, law)
    messages += _capacity_messages(prior, heartbeats)
    values = dict(zip(TERMS, map(float, law.theta), strict=True))
    kv_tokens, max_seqs = _capacity(prior, heartbeats)
    profile = replace(
        prior,
        name=name or prior.name,
        t0_s=values["t0_s"],
        prefill_s_per_token=values["prefill_s_per_token"],
        prefill_s_per_token_pair=values["prefill_s_per_token_pair"],
        decode_s_per_seq=values["decode_s_per_seq"],
        decode_s_per_context_token=values["decode_s_per_context_token"],
        attention_growth_tokens=1 / law.inverse_growth if law.inverse_growth else 0.0,
        noise_sigma=0.0,
        kv_tokens=kv_tokens,
        max_seqs=max_seqs,
    )
    return Calibration(profile, *counts, *errors, *prior_errors, tuple(kept), tuple(messages))


def rescaled(prior: EngineProfile, observations: Observations) -> EngineProfile:
    """``prior`` with every term of its law times one factor: the median ratio of the observed
    decode windows to what the prior predicts of them (a prior for an engine no profile
    describes, of the right order of magnitude); ``prior`` itself without such windows."""
    law = StepLaw.of(prior)
    rows = window_rows(observations, law, prior.prefill_budget_tokens)
    tpot = ~rows.ttft
    if not tpot.any():
        return prior
    factor = float(np.median(rows.y[tpot] / (law.design(rows.x[tpot]) @ law.theta)))
    return replace(
        prior,
        t0_s=prior.t0_s * factor,
        prefill_s_per_token=prior.prefill_s_per_token * factor,
        prefill_s_per_token_pair=prior.prefill_s_per_token_pair * factor,
        decode_s_per_seq=prior.decode_s_per_seq * factor,
        decode_s_per_context_token=prior.decode_s_per_context_token * factor,
    )


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


# --- the fit ------------------------------------------------------------------------------------


def _settle(
    observations: Observations, prior: StepLaw, budget: int, rows: WindowRows
) -> tuple[StepLaw, tuple[str, ...], list[str], WindowRows]:
    """The fit to rows rebuilt where the steps settle (module docstring): the law, the terms
    kept, why, and its rows. ``rows``: those rebuilt with the prior."""
    placed = prior
    for _ in range(ITERATIONS):
        law, kept, reasons = _fit(rows, prior.theta)
        moved = _placement(rows, prior.theta, law)
        if moved.inverse_growth == placed.inverse_growth and np.allclose(
            moved.theta, placed.theta, rtol=CONVERGED, atol=0.0
        ):
            return law, kept, reasons, rows
        placed = moved
        rows = window_rows(observations, placed, budget)
    law, kept, reasons = _fit(rows, prior.theta)
    return law, kept, [*reasons, f"the steps' placement did not settle in {ITERATIONS} rounds"], rows


def _placement(rows: WindowRows, prior: np.ndarray, law: StepLaw) -> StepLaw:
    """The law to rebuild the rows with next: fitted to the TPOT rows alone (at ``law``'s
    growth length), the terms they cannot pin at ``law``'s values (module docstring)."""
    tpot = ~rows.ttft
    scale = np.where(prior > 0, prior, _SCALE)
    normal = _Normal.of(WindowRows(rows.x[tpot], rows.y[tpot], rows.ttft[tpot]), scale)
    return _fit_law(normal, prior, law.inverse_growth, anchor=law.theta)[0]


def _fit(rows: WindowRows, prior: np.ndarray) -> tuple[StepLaw, tuple[str, ...], list[str]]:
    """The law fitted to ``rows`` (module docstring): the nominal one unless a growth length
    lowers the residual enough; the terms kept at the prior's value and why."""
    normal = _Normal.of(rows, np.where(prior > 0, prior, _SCALE))
    nominal = _fit_law(normal, prior, 0.0)
    grown = min((_fit_law(normal, prior, 1 / length) for length in GROWTH_LENGTHS), key=lambda fit: fit[3])
    if grown[3] >= (1 - MIN_GROWTH_GAIN) * nominal[3]:
        return nominal[:3]
    law, kept, reasons, _ = grown
    gain = 1 - grown[3] / nominal[3]
    return (
        law,
        kept,
        [
            f"attention grows with context (L = {1 / law.inverse_growth:.0f} tokens): {gain:.0%} less "
            "squared error than the nominal law",
            *reasons,
        ],
    )


@dataclass(frozen=True, slots=True)
class _Normal:
    """The weighted rows' normal equations over the seven window quantities, each in units of
    its term's ``scale``: ``gram`` (7x7), ``moment`` (7), ``total`` (the weighted target's
    squared norm) and the number of ``rows``. A growth length's five terms are linear
    combinations of the seven (``term_factors``), so every fit of one round shares them."""

    gram: np.ndarray
    moment: np.ndarray
    total: float
    rows: int

    @classmethod
    def of(cls, rows: WindowRows, scale: np.ndarray) -> _Normal:
        weight = 1 / np.hypot(rows.y, WINDOW_FLOOR_S)
        a = rows.x * scale[[0, 1, 2, 2, 3, 4, 4]] * weight[:, None]
        target = rows.y * weight
        return cls(a.T @ a, a.T @ target, float(target @ target), len(rows.y))

    def terms(self, inverse_growth: float) -> tuple[np.ndarray, np.ndarray]:
        """The normal equations of the five terms (gram, moment) at 1/L = ``inverse_growth``."""
        combine = term_factors(np.eye(7), inverse_growth)  # (7, 5)
        return combine.T @ self.gram @ combine, combine.T @ self.moment


def _fit_law(
    normal: _Normal, prior: np.ndarray, inverse_growth: float, anchor: np.ndarray | None = None
) -> tuple[StepLaw, tuple[str, ...], list[str], float]:
    """Non-negative least squares for one growth length: the law, the terms kept (at
    ``anchor``'s values, by default the prior's), why, and the residual sum of squares
    (weighted)."""
    scale = np.where(prior > 0, prior, _SCALE)
    gram, moment = normal.terms(inverse_growth)
    free, kept, reasons = list(range(len(TERMS))), [], []
    while free:
        errors = _standard_errors(gram[np.ix_(free, free)], moment[free], normal.rows, normal.total)
        worst = int(np.argmax(errors))
        if errors[worst] <= MAX_STANDARD_ERROR:
            break
        term = free.pop(worst)
        kept.append(term)
        how = "no data bear on it" if math.isinf(errors[worst]) else f"standard error {errors[worst]:.0%}"
        reasons.append(
            f"{TERMS[term]}: {_WHY_NOT[TERMS[term]]} ({how} of the prior's value): kept the prior's "
            f"{prior[term]:.3g}"
        )
    multipliers = (prior if anchor is None else anchor) / scale  # the kept terms' values
    fixed = gram[:, kept] @ multipliers[kept]
    multipliers[free] = _nnls(gram[np.ix_(free, free)], moment[free] - fixed[free])
    rss = normal.total - 2 * multipliers @ moment + multipliers @ gram @ multipliers
    law = StepLaw(multipliers * scale, inverse_growth)
    return law, tuple(TERMS[k] for k in sorted(kept)), reasons, float(max(rss, 0.0))


def _standard_errors(gram: np.ndarray, moment: np.ndarray, rows: int, total: float) -> np.ndarray:
    """Each term's least-squares standard error from the normal equations (``total``: the
    target's squared norm); infinite for a term the others explain whole, or an empty one."""
    coef = np.linalg.lstsq(gram, moment, rcond=None)[0]
    rss = max(total - 2 * coef @ moment + coef @ gram @ coef, 0.0)
    sigma = math.sqrt(rss / max(rows - len(moment), 1))
    errors = np.full(len(moment), np.inf)
    for k in range(len(moment)):
        others = [i for i in range(len(moment)) if i != k]
        unique = gram[k, k]
        if others:  # what of column k the others do not explain (a Schur complement)
            link = gram[others, k]
            unique -= link @ np.linalg.lstsq(gram[np.ix_(others, others)], link, rcond=None)[0]
        if unique > 1e-12 * max(gram[k, k], 1e-300):
            errors[k] = sigma / math.sqrt(unique)
    return errors


def _nnls(gram: np.ndarray, moment: np.ndarray) -> np.ndarray:
    """argmin ||a x - y|| subject to x >= 0, from the normal equations (gram = a'a, moment =
    a'y), by trying every set of non-zero terms (a law has at most five)."""
    best, best_gain = np.zeros(len(moment)), 0.0
    for size in range(1, len(moment) + 1):
        for chosen in map(list, itertools.combinations(range(len(moment)), size)):
            coef = np.linalg.lstsq(gram[np.ix_(chosen, chosen)], moment[chosen], rcond=None)[0]
            gain = 2 * coef @ moment[chosen] - coef @ gram[np.ix_(chosen, chosen)] @ coef  # RSS lowered by
            if (coef >= 0).all() and gain > best_gain:
                best, best_gain = np.zeros(len(moment)), float(gain)
                best[chosen] = coef
    return best


def _errors(rows: WindowRows, law: StepLaw) -> tuple[float | None, float | None]:
    """Relative RMS of the TTFT rows' and the TPOT rows' predictions."""
    relative = law.design(rows.x) @ law.theta / rows.y - 1

    def rms(mask: np.ndarray) -> float | None:
        return float(np.sqrt(np.mean(relative[mask] ** 2))) if mask.any() else None

    return rms(rows.ttft), rms(~rows.ttft)


# --- capacity -----------------------------------------------------------------------------------


def _capacity(prior: EngineProfile, beats: HeartbeatSummary | None) -> tuple[int, int]:
    """``kv_tokens`` and ``max_seqs`` (module docstring)."""
    if beats is None or beats.kv_blocks_total <= 0:
        return prior.kv_tokens, prior.max_seqs
    seats = prior.max_seqs
    if beats.max_running > seats or (beats.beats_at_seat_limit >= SEAT_LIMIT_BEATS and beats.max_running > 0):
        seats = beats.max_running
    return beats.kv_blocks_total * BLOCK_TOKENS, seats


def _capacity_messages(prior: EngineProfile, beats: HeartbeatSummary | None) -> list[str]:
    if beats is None or beats.kv_blocks_total <= 0:
        return ["no heartbeats: kv_tokens and max_seqs are the prior's"]
    if beats.max_running <= prior.max_seqs and beats.beats_at_seat_limit < SEAT_LIMIT_BEATS:
        return [f"max_seqs: the engines never ran into a seat limit: kept the prior's {prior.max_seqs}"]
    return []


__all__ = [
    "TERMS",
    "Calibration",
    "HeartbeatSummary",
    "Observations",
    "calibrate",
    "observations_from_attempts",
    "rescaled",
]
