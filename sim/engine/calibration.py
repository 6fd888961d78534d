"""Calibration: fit an engine group's step-time law to what its instances recorded.

The rows. Each attempt gives one or two busy windows (a TTFT row, a TPOT row), whose length the
law predicts from the work its instance did in them (N steps, the prefill quantities P, Q, Q2 and
the decode ones D, E, E2): ``sim/engine/busy_windows.py`` rebuilds that work per instance from
the store's ``Observations`` (the busy-window identity and the rebuild: its module docstring).
Where steps lie depends on the law the rows are rebuilt with, so the fit alternates until that
law settles (no row's predicted length moved by more than ``CONVERGED``, the same unknowns kept;
at most ``ITERATIONS`` rounds): rebuild the rows (with the prior first), fit them all, and
rebuild next with the law fitted to the TPOT rows alone, the terms they cannot pin at the
all-rows fit's values; the result is the all-rows fit at the settled rows. Which unknowns the
data cannot pin (below) is decided in every round, on its rows; a term near the limit can be
pinned in one round, which moves the steps, and not in the next, which moves them back (or one
of two terms the rows cannot tell apart in one round, the other in the next). So when a round
keeps the same unknowns as an earlier one but not the last, the rounds alternate: that round's
choice stands from then on, no longer assessed, and the rounds settle. Rounds that have not
settled after ``ITERATIONS`` wander about a law rather than toward it (each placement moves the
few steps whose place the data hardly fix, and the fit follows them): the result is then the mean
of the laws of the later half of the rounds, those that kept the unknowns and growth length the
rounds ended with (the iterates' average, Polyak-Ruppert), at rows rebuilt with it, not whichever
law the rounds happened to end on.

Why the TPOT rows: both ends of a TPOT window are step ends (a first token, a last token), so
each step lies whole inside it or outside, and its N is exact; where the rebuild puts a step's
start does not change them. A TTFT window opens at an arrival, in
the middle of the work: its content follows the placement, and a placement from a wrong law
agrees with that law (a prefill step placed too short leaves room for decode-only steps that
make up the difference), so a fit of all rows moves only a little way from the law it was
rebuilt with in each round.

The fit. The unknowns (``UNKNOWNS``) are the law's five terms and the delay ``token_delay_s``
(``sim/engine/profiles.py``): a TTFT row holds it beside the steps of its window, a TPOT row
not at all (the rows' identity, ``sim/engine/busy_windows.py``, where its column is: a window
that opened on a busy engine holds the delay whatever it is, one that opened on an idle one
tells it). Without it, the time a first token takes besides the engine's steps
(detokenization, the API server, the stream) goes to whatever term the shortest TTFT windows
share, the steps' fixed cost, and the fit takes it back from the batch's terms: long busy
windows come out short.

Each row is divided by its *predicted* length floored at ``WINDOW_FLOOR_S`` (the root of the
sum of their squares): residuals are relative errors, but not on the shortest windows, whose
lengths the store's millisecond leaves a few per cent uncertain. The predictions are those of a
fit of every unknown (nominal law) weighed by the predictions before it, the prior's first,
until they settle (iteratively reweighted least squares, the quasi-likelihood fit of errors
proportional to the mean). Divided by its observed length
instead, a window that came out short by noise weighs more than one that came out long, and
the law comes out short (fast) by about the square of the relative noise. Free, because whether
a term is pinned is a yes or no that the weights would move.

Each unknown is scaled by the prior's value (the unknowns are multipliers of the prior), then
solved by non-negative least squares, for L infinite (the nominal law) and for each length of
``GROWTH_LENGTHS``; a finite L (the perturbed law's attention growth) is kept only when it
lowers the residual sum of squares by ``MIN_GROWTH_GAIN`` or more. An unknown the data cannot
pin keeps the prior's value, and the result says so (``Calibration.messages``): one whose
standard error exceeds ``MAX_STANDARD_ERROR`` of the larger of its prior's value and its fitted
one -- ``b`` without long prompts, ``c`` when the batch hardly varies; the worst is fixed
first, then the rest assessed again. The larger, because a prior far below the truth would
otherwise keep a term the data measure well. Its fitted value: non-negative least squares, the
kept unknowns at their values (of two terms the rows cannot tell apart, the one they explain
better). Its standard error: least squares', the other free unknowns beside it, with rows
whose windows overlap counted as fewer (``WindowRows.overlap``, the design effect of
overlapping observations): such rows share the steps within, and those steps' noise, so the
rows alone would make a term look better measured than it is.

Residual error: the relative RMS of the rows' predictions against what was observed, TTFT and
TPOT apart, at the fitted law (and at the prior's, for comparison). A fit whose residual error
is well above the prior's (``FAILED_FIT``) has failed (the unknowns traded against each other
on rows that cannot part them): it is fitted again with the delay held at the prior's value,
and if that fails too, the prior's law is kept; the result says so. Engine noise, pre-emptions
and requests that left before their first token are not rebuilt: they show as residual error.

Noise. An engine's steps vary about its law (the machine, the kernels); the simulator draws a
factor of standard deviation ``noise_sigma`` per planned step. Without it, replayed engines keep
in step where real ones drift apart: a closed loop of users sent in turn to two engines stays
split evenly between them, where noise soon tips it into the lasting state in which one engine
holds most of the calls. The noise is measured on the TTFT rows whose window holds a single
step (at most ``ONE_STEP`` steps: a call that found its engine idle and was prefilled in one
step), whose error is that one step's and its delay's: ``noise_sigma`` the steps' relative
error, ``token_delay_sigma`` the delay's, told apart where some of those rows are mostly step
(a long prompt) and some mostly delay (a cache hit's short prefill), else all of it the steps'
(``_noise``): the delay (the API server, the stream, whatever shares the engine's machine)
varies apart from the steps, and where most calls are cache hits, whose step is short, its
spread is most of their TTFT's. What the law misses there counts as noise too, and the law
fitted to those rows takes part of their noise (the estimate is a little low on an engine that
follows the law). Rows of more steps would understate it more (their steps' factors average
out). Fewer than ``MIN_ROWS`` such rows: no noise, and the result says so.

Capacity (``kv_tokens``, ``kv_block_tokens``, ``max_seqs``, ``prefill_budget_tokens``) comes
from the heartbeats (``sim/engine/heartbeat_capacity.py``), before the fit: the steps are rebuilt
under the step budget the engines ran with. The fitted profile's other fields are the prior's.

Followed: the time-integrated exposures and non-negative least squares of BLIS's trace-only
estimator (inference-sim/blis, ``python/estimators/baseline.py``, commit 087bb0a), and its
README's iterative step-density reweighting; here with attention terms, TTFT windows that hold
the queue, chunked prefill rebuilt as vLLM schedules it, and a prior for what the data cannot pin.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from sim.engine.busy_windows import TERMS, Observations, StepLaw, WindowRows, term_factors, window_rows
from sim.engine.heartbeat_capacity import HeartbeatSummary, capacity_messages, with_capacity
from sim.engine.profiles import PROFILES, EngineProfile

UNKNOWNS = (*TERMS, "token_delay_s")
"""What the fit solves for (``EngineProfile`` fields): the law's terms, then the delay."""
_DELAY = len(TERMS)
"""The delay's index in ``UNKNOWNS``."""
_WHY_NOT = {
    "t0_s": "steps too alike to part the fixed cost from the batch's",
    "prefill_s_per_token": "too little prefill",
    "prefill_s_per_token_pair": "no long prompts",
    "decode_s_per_seq": "batch sizes too alike",
    "decode_s_per_context_token": "decode contexts too alike",
    "token_delay_s": "TTFT windows too alike to part it from the steps",
}
ITERATIONS = 24
CONVERGED = 0.002
"""The fit stops after ``ITERATIONS`` rounds, or when no row's predicted length moved by more
than this share (module docstring)."""
MAX_STANDARD_ERROR = 0.5
"""An unknown is fitted when its standard error is at most this share of the larger of its
prior's value and its fitted one."""
GROWTH_LENGTHS = tuple(4096.0 * 2**k for k in range(8))
"""The attention growth lengths L tried beside the nominal law (tokens)."""
MIN_GROWTH_GAIN = 0.02
"""A finite L is kept when it lowers the residual sum of squares by at least this share."""
MIN_ROWS = 10
"""Fewest TTFT rows, and TPOT rows, to fit anything."""
FAILED_FIT = 1.5
"""A fit whose residual error (TTFT + TPOT) exceeds the prior's by this factor failed: the
prior's law is kept. Not 1: the fit weighs rows by their predicted length, the residual by the
observed one, so a fit beside a prior that is the truth can come out a little above it."""
ONE_STEP = 1.05
"""A TTFT window of at most this many steps measures one step's noise (one step, and a sliver
of a neighbouring step's time that the millisecond rounding of the store leaves in it)."""
WINDOW_FLOOR_S = 0.02
"""Rows weigh as relative errors of windows at least this long (module docstring)."""
_H100 = PROFILES["llama3-8b-h100"]
_SCALE = np.array([*(getattr(_H100, term) for term in TERMS), _H100.t0_s])
"""Units of an unknown whose prior is 0 (for the multipliers and their standard errors): the
built-in profile's value; for the delay, a step's fixed cost."""


@dataclass(frozen=True, slots=True)
class Calibration:
    """A fitted profile, its rows, its residual errors (relative RMS; None: no rows) beside the
    prior's, the unknowns kept at the prior's value (``UNKNOWNS``), and what to tell the user."""

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
    """Fit ``prior``'s law and delay to ``observations`` (module docstring); the profile is
    named ``name`` (default: the prior's)."""
    sized = with_capacity(prior, heartbeats)
    start = law = StepLaw.of(sized)
    budget = sized.prefill_budget_tokens
    rows = window_rows(observations, law, budget)
    prior_errors = _errors(rows, law)
    kept: tuple[str, ...] = UNKNOWNS
    messages: list[str] = []
    counts = int(rows.ttft.sum()), int((~rows.ttft).sum())
    if min(counts) < MIN_ROWS:
        messages.append(
            f"only {counts[0]} attempts with a first token and {counts[1]} ended ok with two tokens or "
            f"more: too few to fit (at least {MIN_ROWS} each); the prior's law kept"
        )
    else:
        first_rows = rows
        law, kept, reasons, rows = _settle(observations, start, budget, rows)
        if _worse(_errors(rows, law), prior_errors):  # failed: fit again with the delay held
            fitted = _errors(rows, law)
            failed = f"(TTFT {_share(fitted[0])}, TPOT {_share(fitted[1])})"
            law, kept, reasons, rows = _settle(observations, start, budget, first_rows, ("token_delay_s",))
            reasons = [f"token_delay_s: the fit with it failed {failed}: kept the prior's", *reasons]
        messages += reasons
        if _worse(_errors(rows, law), prior_errors):  # a failed fit: the prior describes it better
            fitted = _errors(rows, law)
            messages.append(
                f"the fit's residual error (TTFT {_share(fitted[0])}, TPOT {_share(fitted[1])}) exceeds the "
                f"prior's ({_share(prior_errors[0])}, {_share(prior_errors[1])}): the prior's law kept"
            )
            law, kept, rows = start, UNKNOWNS, first_rows
    errors = _errors(rows, law)
    noise = _noise(rows, law)
    if noise.steps is None:
        messages.append(
            f"noise_sigma: only {noise.one_step_windows} first-token windows of one step "
            f"(at least {MIN_ROWS}): the steps' noise is not measured, none simulated"
        )
    elif noise.delay is None and law.token_delay_s > 0:
        messages.append(
            f"token_delay_sigma: fewer than {MIN_ROWS} first-token windows of one step mostly "
            "step or mostly delay: their noise is not told apart, all of it counted as the steps'"
        )
    messages += capacity_messages(prior, heartbeats)
    values = dict(zip(TERMS, map(float, law.theta), strict=True))
    profile = replace(
        sized,
        name=name or prior.name,
        t0_s=values["t0_s"],
        prefill_s_per_token=values["prefill_s_per_token"],
        prefill_s_per_token_pair=values["prefill_s_per_token_pair"],
        decode_s_per_seq=values["decode_s_per_seq"],
        decode_s_per_context_token=values["decode_s_per_context_token"],
        attention_growth_tokens=1 / law.inverse_growth if law.inverse_growth else 0.0,
        token_delay_s=float(law.token_delay_s),
        noise_sigma=noise.steps or 0.0,
        token_delay_sigma=noise.delay or 0.0,
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


# --- the fit ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Fit:
    """One fit: the law, the unknowns kept at the prior's value, why, and what to note of it."""

    law: StepLaw
    kept: tuple[str, ...]
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()


def _settle(
    observations: Observations, prior: StepLaw, budget: int, rows: WindowRows, held: tuple[str, ...] = ()
) -> tuple[StepLaw, tuple[str, ...], list[str], WindowRows]:
    """The fit to rows rebuilt where the steps settle (module docstring): the law, the
    unknowns kept, why, and its rows. ``rows``: those rebuilt with the prior; ``held``: unknowns
    kept at the prior's values throughout."""
    placed = prior
    decided: tuple[str, ...] | None = None  # the unknowns held once the rounds alternate
    rounds: list[tuple[str, ...]] = []  # the unknowns each round kept
    why: dict[str, str] = {}
    settled = False
    laws: list[StepLaw] = []  # each round's fitted law
    for _ in range(ITERATIONS + 1):
        expected = _expected(rows, prior)
        fit = _fit(rows, prior, expected, decided or held, assess=decided is None)
        if decided is None and rounds and fit.kept != rounds[-1] and fit.kept in rounds:
            decided = fit.kept  # alternating: the choice made now stands
        why.update((reason.split(":", 1)[0], reason) for reason in fit.reasons)
        moved = _placement(rows, prior, fit.law, expected)
        settled = _same(moved, placed, rows) and bool(rounds) and fit.kept == rounds[-1]
        rounds.append(fit.kept)
        laws.append(fit.law)
        if settled or len(rounds) > ITERATIONS:
            break
        placed = moved
        rows = window_rows(observations, placed, budget)
    messages = [*fit.notes, *(why[name] for name in fit.kept if name in why)]
    law = fit.law
    if not settled:
        later = zip(rounds[len(laws) // 2 :], laws[len(laws) // 2 :], strict=True)
        alike = [one for kept, one in later if kept == fit.kept and one.inverse_growth == law.inverse_growth]
        law = StepLaw(
            np.mean([one.theta for one in alike], axis=0),
            law.inverse_growth,
            float(np.mean([one.token_delay_s for one in alike])),
        )
        rows = window_rows(observations, _placement(rows, prior, law, expected), budget)
        messages.append(
            f"the steps' placement did not settle in {ITERATIONS} rounds: the law is the mean of "
            f"its last {len(alike)} rounds' laws"
        )
    return law, fit.kept, messages, rows


def _same(one: StepLaw, other: StepLaw, rows: WindowRows) -> bool:
    """The two laws place the steps alike: the same growth length, no row's predicted length
    apart by more than ``CONVERGED`` of it, and delays apart by no more than that of the floor.
    (Predictions, not terms: a term the rows hardly bear on may creep from round to round
    without moving anything.)"""
    return (
        one.inverse_growth == other.inverse_growth
        and bool(np.allclose(one.predict(rows), other.predict(rows), rtol=CONVERGED, atol=0.0))
        and abs(one.token_delay_s - other.token_delay_s) <= CONVERGED * WINDOW_FLOOR_S
    )


def _placement(rows: WindowRows, prior: StepLaw, law: StepLaw, expected: np.ndarray) -> StepLaw:
    """The law to rebuild the rows with next: fitted to the TPOT rows alone (at ``law``'s
    growth length), the unknowns they cannot pin (the delay among them) at ``law``'s values
    (module docstring)."""
    tpot = ~rows.ttft
    normal = _Normal.of(rows.subset(tpot), _scale(prior), expected[tpot])
    return _fit_law(normal, prior, law.inverse_growth, held=(), anchor=law)[0].law


def _expected(rows: WindowRows, prior: StepLaw) -> np.ndarray:
    """The lengths that weigh ``rows`` (module docstring): the predictions of the nominal law
    and the delay fitted with every unknown free, each time weighed by the predictions before it
    (``prior``'s first), until they settle."""
    expected = prior.predict(rows)
    for _ in range(ITERATIONS):
        normal = _Normal.of(rows, _scale(prior), expected)
        predicted = _fit_law(normal, prior, 0.0, held=(), assess=False)[0].law.predict(rows)
        if np.allclose(predicted, expected, rtol=CONVERGED, atol=0.0):
            return predicted
        expected = predicted
    return expected


def _fit(
    rows: WindowRows, prior: StepLaw, expected: np.ndarray, held: tuple[str, ...], assess: bool = True
) -> _Fit:
    """The law fitted to ``rows``, each weighed by its ``expected`` length (module docstring):
    the nominal one unless a growth length lowers the residual enough. The unknowns ``held``
    stay at the prior's values and, when ``assess``, those the standard errors reject join
    them (``reasons``: why, for those)."""
    normal = _Normal.of(rows, _scale(prior), expected)
    nominal = _fit_law(normal, prior, 0.0, held, assess=assess)
    grown = min(
        (_fit_law(normal, prior, 1 / length, held, assess=assess) for length in GROWTH_LENGTHS),
        key=lambda f: f[1],
    )
    if grown[1] >= (1 - MIN_GROWTH_GAIN) * nominal[1]:
        return nominal[0]
    fit, rss = grown
    note = (
        f"attention grows with context (L = {1 / fit.law.inverse_growth:.0f} tokens): "
        f"{1 - rss / nominal[1]:.0%} less squared error than the nominal law"
    )
    return replace(fit, notes=(note,))


def _scale(prior: StepLaw) -> np.ndarray:
    """The units of the unknowns: the prior's values, ``_SCALE``'s where they are 0."""
    values = _vector(prior)
    scale: np.ndarray = np.where(values > 0, values, _SCALE)
    return scale


def _vector(law: StepLaw) -> np.ndarray:
    """``law``'s unknowns in ``UNKNOWNS`` order."""
    return np.append(law.theta, law.token_delay_s)


@dataclass(frozen=True, slots=True)
class _Normal:
    """The weighted rows' normal equations over the seven window quantities and the delay's
    factor (``WindowRows.delay_factor``), each in units of its unknown's ``scale``: ``gram``
    (8x8), ``moment`` (8), ``total`` (the weighted target's squared norm), the number of
    ``rows`` and their windows' ``overlap`` (``WindowRows.overlap``). A growth length's five
    terms are linear combinations of the seven (``term_factors``), so every fit of one round
    shares them."""

    gram: np.ndarray
    moment: np.ndarray
    total: float
    rows: int
    overlap: float = 1.0

    @classmethod
    def of(cls, rows: WindowRows, scale: np.ndarray, expected: np.ndarray) -> _Normal:
        weight = 1 / np.hypot(expected, WINDOW_FLOOR_S)
        columns = np.column_stack([rows.x, rows.delay_factor])
        a = columns * scale[[0, 1, 2, 2, 3, 4, 4, _DELAY]] * weight[:, None]
        rebuilt = rows.delay_s * (rows.ttft - rows.delay_factor)  # the rows' own delay, where it stays
        target = (rows.y - rebuilt) * weight
        return cls(a.T @ a, a.T @ target, float(target @ target), len(rows.y), rows.overlap)

    def unknowns(self, inverse_growth: float) -> tuple[np.ndarray, np.ndarray]:
        """The normal equations of the six unknowns (gram, moment) at 1/L = ``inverse_growth``."""
        combine = np.zeros((8, len(UNKNOWNS)))
        combine[:7, :_DELAY] = term_factors(np.eye(7), inverse_growth)
        combine[7, _DELAY] = 1.0
        return combine.T @ self.gram @ combine, combine.T @ self.moment


def _fit_law(
    normal: _Normal,
    prior: StepLaw,
    inverse_growth: float,
    held: tuple[str, ...],
    anchor: StepLaw | None = None,
    assess: bool = True,
) -> tuple[_Fit, float]:
    """Non-negative least squares for one growth length: the fit (the unknowns ``held`` and,
    when ``assess``, those the standard errors reject, at ``anchor``'s values, by default the
    prior's) and the residual sum of squares (weighted)."""
    scale = _scale(prior)
    gram, moment = normal.unknowns(inverse_growth)
    values = _vector(prior if anchor is None else anchor)
    multipliers = values / scale  # the kept unknowns' values
    kept, reasons = [UNKNOWNS.index(name) for name in held], []
    if assess:
        reasons = _rejected(gram, moment, normal, multipliers * scale, multipliers, kept)
    free = [k for k in range(len(UNKNOWNS)) if k not in kept]
    fixed = gram[:, kept] @ multipliers[kept]
    multipliers[free] = _nnls(gram[np.ix_(free, free)], moment[free] - fixed[free])
    rss = normal.total - 2 * multipliers @ moment + multipliers @ gram @ multipliers
    values = multipliers * scale
    law = StepLaw(values[:_DELAY], inverse_growth, float(values[_DELAY]))
    fit = _Fit(law, tuple(UNKNOWNS[k] for k in sorted(kept)), tuple(reasons))
    return fit, float(max(rss, 0.0))


def _rejected(
    gram: np.ndarray,
    moment: np.ndarray,
    normal: _Normal,
    values: np.ndarray,
    multipliers: np.ndarray,
    kept: list[int],
) -> list[str]:
    """Add to ``kept`` the unknowns the data cannot pin beside those it holds (module
    docstring), worst first; why, for each. ``values``: what a kept unknown keeps (its
    ``multipliers``: in the units of ``gram`` and ``moment``, the normal equations of all)."""
    free, reasons = [k for k in range(len(UNKNOWNS)) if k not in kept], []
    while free:
        # The free unknowns' normal equations with the kept ones at their values.
        held = multipliers[kept]
        rest = moment[free] - gram[np.ix_(free, kept)] @ held
        total = normal.total - 2 * held @ moment[kept] + held @ gram[np.ix_(kept, kept)] @ held
        errors = _standard_errors(gram[np.ix_(free, free)], rest, total, normal)
        fitted = _nnls(gram[np.ix_(free, free)], rest)
        share = errors / np.maximum(fitted, 1.0)  # multipliers: 1 is the prior's value
        worst = int(np.argmax(share))
        if share[worst] <= MAX_STANDARD_ERROR:
            break
        term = free.pop(worst)
        kept.append(term)
        how = (
            "no data bear on it"
            if math.isinf(share[worst])
            else f"standard error {share[worst]:.0%} of the larger of its prior and fitted values"
        )
        name = UNKNOWNS[term]
        reasons.append(f"{name}: {_WHY_NOT[name]} ({how}): kept the prior's {values[term]:.3g}")
    return reasons


def _standard_errors(gram: np.ndarray, moment: np.ndarray, total: float, normal: _Normal) -> np.ndarray:
    """Each unknown's least-squares standard error from the normal equations ``gram`` and
    ``moment`` of some of ``normal``'s unknowns (``total``: their target's squared norm);
    infinite for one the others explain whole, or an empty one. Rows whose windows overlap
    share the noise of the steps within: the errors are those of rows ``normal.overlap`` times
    fewer."""
    coef = np.linalg.lstsq(gram, moment, rcond=None)[0]
    rss = max(total - 2 * coef @ moment + coef @ gram @ coef, 0.0)
    sigma = math.sqrt(normal.overlap * rss / max(normal.rows - len(moment), 1))
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
    a'y), by trying every set of non-zero unknowns (a fit has at most six)."""
    best, best_gain = np.zeros(len(moment)), 0.0
    for size in range(1, len(moment) + 1):
        for chosen in map(list, itertools.combinations(range(len(moment)), size)):
            coef = np.linalg.lstsq(gram[np.ix_(chosen, chosen)], moment[chosen], rcond=None)[0]
            gain = 2 * coef @ moment[chosen] - coef @ gram[np.ix_(chosen, chosen)] @ coef  # RSS lowered by
            if (coef >= 0).all() and gain > best_gain:
                best, best_gain = np.zeros(len(moment)), float(gain)
                best[chosen] = coef
    return best


def _worse(errors: tuple[float | None, float | None], than: tuple[float | None, float | None]) -> bool:
    """Whether ``errors`` (TTFT, TPOT) sum to more than ``FAILED_FIT`` times ``than``'s (a
    missing one counts 0)."""
    return sum(e or 0.0 for e in errors) > FAILED_FIT * sum(e or 0.0 for e in than)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _errors(rows: WindowRows, law: StepLaw) -> tuple[float | None, float | None]:
    """Relative RMS of the TTFT rows' and the TPOT rows' predictions."""
    relative = law.predict(rows) / rows.y - 1

    def rms(mask: np.ndarray) -> float | None:
        return float(np.sqrt(np.mean(relative[mask] ** 2))) if mask.any() else None

    return rms(rows.ttft), rms(~rows.ttft)


@dataclass(frozen=True, slots=True)
class _Noise:
    """The noise of the steps (``noise_sigma``, None: not measured) and of the delay
    (``token_delay_sigma``, None: not told apart from the steps'), measured on
    ``one_step_windows`` TTFT windows of one step."""

    steps: float | None
    delay: float | None
    one_step_windows: int


def _noise(rows: WindowRows, law: StepLaw) -> _Noise:
    """The noise of ``law``'s TTFT rows of one step (``ONE_STEP``; module docstring).

    Such a row is one step s and the delay d, each with its own relative noise: its relative
    error e = (s + d) / y - 1 has variance sigma_s^2 (s / (s + d))^2 + sigma_d^2 (d / (s + d))^2
    (to first order).
    The two variances are the non-negative least squares of e^2 on those two shares, where
    ``MIN_ROWS`` rows or more are mostly step and as many mostly delay; otherwise the rows
    cannot tell them apart and all of e is the steps' noise: the least squares of e^2 on the
    steps' share alone (the relative RMS of e where there is no delay). Fewer than ``MIN_ROWS``
    rows: neither. A row the law gives no length (no step in it, and no delay) tells neither
    noise and is left out."""
    predicted = law.predict(rows)
    one_step = rows.ttft & (rows.x[:, 0] <= ONE_STEP) & (predicted > 0)
    count = int(one_step.sum())
    if count < MIN_ROWS:
        return _Noise(None, None, count)
    predicted = predicted[one_step]
    relative = predicted / rows.y[one_step] - 1
    step_share = (law.design(rows.x[one_step]) @ law.theta) / predicted
    mostly_step = int((step_share > 0.5).sum())
    told_apart = min(mostly_step, count - mostly_step) >= MIN_ROWS
    shares = np.column_stack([step_share**2, (1 - step_share) ** 2])[:, : 2 if told_apart else 1]
    sigmas = np.sqrt(_nnls(shares.T @ shares, shares.T @ relative**2))
    return _Noise(float(sigmas[0]), float(sigmas[1]) if told_apart else None, count)


__all__ = [
    "TERMS",
    "UNKNOWNS",
    "Calibration",
    "HeartbeatSummary",
    "Observations",
    "calibrate",
    "rescaled",
]
