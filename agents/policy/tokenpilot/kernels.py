"""TokenPilot's per-row arithmetic, compiled: one loop over the view's rows per step of a decision.

Why compiled: the formulas of ``router.py``, ``queues.py`` and ``stepclock.py`` written as numpy
array expressions cost a decision one numpy call per operation, each at a fixed cost whatever the
pool size, so a small pool paid as much as a large one (docs/results/speed.md). Each kernel here
is one call.

Contract shared by every kernel: it computes, element by element, exactly the expression named
in its docstring, with the operations in the order written there, in IEEE float64 (``kernel``:
no fast-math, no fused multiply-add), so its results are bit for bit those of the numpy
expressions it replaced. ``min`` / ``max`` are numpy's ``minimum`` / ``maximum`` (NaN wins).
Integers (counts, tokens, blocks) arrive as float64 where the formula multiplies them by a
float; every such value is below 2**53, so the conversion is exact. Two steps stay in numpy
because numpy's result depends on its own implementation: ``exp`` (its SIMD exp differs from
the C library's in the last bit) and the ``features @ θ`` product (OpenBLAS's summation order).

Arguments are 1-d arrays of one value per row of the view (``n``) unless said otherwise;
``profile_of_row[i]`` indexes ``thetas`` (one row of θ per engine profile, in ``FEATURES``
order: T0, c, d, a, b, ...); features and θ are indexed by the names of ``features.py``.
``out`` arguments are written (and read back only where the kernel wrote them). Nothing is
allocated.
"""

from __future__ import annotations

import numpy as np

from agents.policy.common.compiled import kernel
from agents.policy.common.numeric import BoolArray, FloatArray, IntArray
from agents.policy.tokenpilot.features import (
    BOUNDARY_WAIT,
    KV_SHORTFALL,
    PREFILL_PAIRS,
    PREFILL_TOKENS,
    STEPS,
    STEPS_X_BATCH,
    STEPS_X_CONTEXT,
)
from agents.policy.tokenpilot.lateness import BUCKETS, MIN_TOKENS
from agents.policy.types import BLOCK_TOKENS

# (constants as floats: a kernel mixing a float with an int global converts at every use)
_MIN_TOKENS = float(MIN_TOKENS)
_BLOCK = float(BLOCK_TOKENS)
_LAST_BUCKET = BUCKETS - 1


@kernel
def _min(a: float, b: float) -> float:
    """``np.minimum`` of two floats: the smaller; NaN if either is NaN."""
    return a if (a <= b or a != a) else b


@kernel
def _max(a: float, b: float) -> float:
    """``np.maximum`` of two floats: the larger; NaN if either is NaN."""
    return a if (a >= b or a != a) else b


@kernel
def _lateness_of(tokens: float, ratio: FloatArray) -> float:
    """``PrefillLateness.of_rows`` for one value: 1 below ``MIN_TOKENS``, else ``ratio[b]`` with
    ``b = min(floor(log2(max(tokens, 1) / MIN_TOKENS)), BUCKETS - 1)``. The floor of the log is
    found by comparing with powers of two, which is exact where ``log2`` could round."""
    if tokens < _MIN_TOKENS:
        return 1.0
    scaled = _max(tokens, 1.0) / _MIN_TOKENS
    bucket = 0
    bound = 2.0
    while bucket < _LAST_BUCKET and scaled >= bound:
        bucket += 1
        bound *= 2.0
    return float(ratio[bucket])


@kernel
def queue_pace(
    budget: float,
    tokens: FloatArray,
    pairs: FloatArray,
    head_tokens: FloatArray,
    counts: IntArray,
    sent: IntArray,
    sent_tokens: IntArray,
    profile_of_row: IntArray,
    thetas: FloatArray,
    lateness: FloatArray,
    step_out: FloatArray,
) -> None:
    """The pace the queue ahead drains at per row (``TokenPilot._queued``): one full prefill step
    of ``budget`` tokens,

        step_out = ((T0 + a·budget) + c·B + d·C + b·(budget·R / max(Q, 1))) · L

    Q, R = ``tokens``, ``pairs``; B = running + sent, C = tokens_in_flight + sent_tokens (running,
    tokens_in_flight: ``counts[0]``, ``counts[1]``); L = lateness of ``head_tokens`` (1 unless
    ``lateness[-1] > 1``; ``lateness`` is ``PrefillLateness.ratio``)."""
    late_on = lateness[lateness.shape[0] - 1] > 1.0
    for i in range(tokens.shape[0]):
        theta = thetas[profile_of_row[i]]
        batch = float(counts[0, i] + sent[i])
        context = float(counts[1, i] + sent_tokens[i])
        pairs_per_step = budget * pairs[i] / _max(tokens[i], 1.0)
        step = (
            (theta[STEPS] + theta[PREFILL_TOKENS] * budget)
            + theta[STEPS_X_BATCH] * batch
            + theta[STEPS_X_CONTEXT] * context
        )
        step = step + theta[PREFILL_PAIRS] * pairs_per_step
        if late_on:
            step *= _lateness_of(head_tokens[i], lateness)
        step_out[i] = step


@kernel
def decay_exponent(now_s: float, horizon_s: float, as_of: FloatArray, out: FloatArray) -> None:
    """``out = -max(now - as_of, 0) / horizon_s`` (``exp`` of it, in numpy, decays ``recent``)."""
    for i in range(as_of.shape[0]):
        out[i] = -_max(now_s - as_of[i], 0.0) / horizon_s


@kernel
def drain(
    now_s: float,
    budget: float,
    step_s: FloatArray,
    decay: FloatArray,
    tokens: FloatArray,
    pairs: FloatArray,
    as_of: FloatArray,
    recent: FloatArray,
    head_due: FloatArray,
    head_tokens: FloatArray,
    head_depth: FloatArray,
) -> None:
    """``PrefillQueues.drain`` in place: every row advanced to ``now_s``, ``budget`` tokens per
    ``step_s`` seconds, ``recent`` times ``decay``:

        done   = max(now - as_of, 0) · budget / max(step_s, 1e-6)
        left   = min(max(1 - done / max(tokens, 1e-9), 0), 1)
        tokens, pairs = tokens · left, pairs · left;  recent = recent · decay

    then, if some row is late (``head_due + step_s < now``: still prefilling its oldest send),
    on every row ``floor = min(head_tokens, budget)`` if late else 0, ``pairs = max(pairs,
    floor · (head_depth - floor / 2))``, ``tokens = max(tokens, floor)``; and ``as_of = max(as_of,
    now)``."""
    n = tokens.shape[0]
    any_late = False
    for i in range(n):
        elapsed = _max(now_s - as_of[i], 0.0)
        done = elapsed * budget / _max(step_s[i], 1e-6)
        recent[i] *= decay[i]
        left = _min(_max(1.0 - done / _max(tokens[i], 1e-9), 0.0), 1.0)
        tokens[i] *= left
        pairs[i] *= left
        if head_due[i] + step_s[i] < now_s:
            any_late = True
    if any_late:
        for i in range(n):
            floor = _min(head_tokens[i], budget) if head_due[i] + step_s[i] < now_s else 0.0
            pairs[i] = _max(pairs[i], floor * (head_depth[i] - floor * 0.5))
            tokens[i] = _max(tokens[i], floor)
    for i in range(n):
        as_of[i] = _max(as_of[i], now_s)


@kernel
def row_features(
    input_tokens: float,
    blocks_needed: float,
    output_budget: float,
    budget: float,
    now_s: float,
    phase_steps: float,
    lost_share: float,
    matched: IntArray,
    counts: IntArray,
    sent: IntArray,
    sent_tokens: IntArray,
    queued: FloatArray,
    queued_pairs: FloatArray,
    open_requests: IntArray,
    profile_of_row: IntArray,
    thetas: FloatArray,
    scales: FloatArray,
    clock_slot_of_row: IntArray,
    boundary_s: FloatArray,
    sent_s: FloatArray,
    awaiting: IntArray,
    touched: BoolArray,
    step_by_slot: FloatArray,
    features_out: FloatArray,
    rows_out: FloatArray,
) -> None:
    """The request's features on every row (``TokenPilot._features``). Per row, with
    ``matched`` leading blocks cached and ``counts`` = (running, tokens_in_flight, free KV
    blocks) as the heartbeat said (3 x n):

        cached = min(matched · BLOCK_TOKENS, input - 1);  P = input - cached
        pairs  = P · (cached + P / 2);  B = running + sent;  C = tokens_in_flight + sent_tokens
        steps  = ceil((queued + P) / budget);  s = T0 + c·B + d·C       (a decode step there)
        features_out[i] = steps, steps · B, steps · C, queued + P, queued_pairs + pairs,
                          max(blocks_needed - matched - free + (sent · output_budget +
                              sent_tokens) / BLOCK_TOKENS, 0),
                          the step clock's wait (``boundary_wait``, ``scales`` by profile)
        rows_out[:, i]  = P, pairs, B, C, s

    ``features_out`` is n x 7, ``rows_out`` 5 x n; the step clock's columns are by its slots
    (``clock_slot_of_row``)."""
    last_token = input_tokens - 1
    for i in range(matched.shape[0]):
        cached = _min(matched[i] * _BLOCK, last_token)
        new = input_tokens - cached
        own_pairs = new * (cached + new * 0.5)
        batch = float(counts[0, i] + sent[i])
        context = float(counts[1, i] + sent_tokens[i])
        total = queued[i] + new
        steps = np.ceil(total / budget)
        features_out[i, STEPS] = steps
        features_out[i, STEPS_X_BATCH] = steps * batch
        features_out[i, STEPS_X_CONTEXT] = steps * context
        features_out[i, PREFILL_TOKENS] = total
        features_out[i, PREFILL_PAIRS] = queued_pairs[i] + own_pairs
        short = blocks_needed - float(matched[i])
        short -= float(counts[2, i])
        unseen = float(sent[i]) * output_budget
        unseen += float(sent_tokens[i])
        unseen /= _BLOCK
        short += unseen
        features_out[i, KV_SHORTFALL] = _max(short, 0.0)
        profile = profile_of_row[i]
        theta = thetas[profile]
        step = theta[STEPS] + theta[STEPS_X_BATCH] * batch + theta[STEPS_X_CONTEXT] * context
        slot = clock_slot_of_row[i]
        step_by_slot[slot] = step
        features_out[i, BOUNDARY_WAIT] = _wait(
            now_s, phase_steps, lost_share, open_requests[i], 0.0 if touched[slot] else batch, step,
            scales[profile], boundary_s[slot], sent_s[slot], awaiting[slot],
        )  # fmt: skip
        rows_out[0, i] = new
        rows_out[1, i] = own_pairs
        rows_out[2, i] = batch
        rows_out[3, i] = context
        rows_out[4, i] = step


@kernel
def _wait(
    now_s: float,
    phase_steps: float,
    lost_share: float,
    open_requests: int,
    batch: float,
    step_s: float,
    scale: float,
    boundary_s: float,
    sent_s: float,
    awaiting: int,
) -> float:
    """``boundary_wait`` of one row, from its slot's clock values."""
    if not open_requests > 0 and not batch > 0:
        return 0.0
    step = _max(step_s * scale, 1e-6)
    age = now_s - boundary_s
    if age <= phase_steps * step and awaiting == 0 and sent_s <= boundary_s:
        return float(step - np.fmod(age, step))
    return lost_share * step


@kernel
def boundary_wait(
    now_s: float,
    phase_steps: float,
    lost_share: float,
    open_requests: IntArray,
    batch: FloatArray,
    step_s: FloatArray,
    scale: FloatArray,
    slot_of_row: IntArray,
    boundary_s: FloatArray,
    sent_s: FloatArray,
    awaiting: IntArray,
    touched: BoolArray,
    step_by_slot: FloatArray,
    wait_out: FloatArray,
) -> None:
    """``StepClock.wait`` per row (its docstring); the clock's columns are by slot
    (``slot_of_row``). Records ``step_by_slot[slot] = step_s``. Busy: ``open_requests > 0``, or
    ``batch > 0`` on an instance never sent to. Not busy: 0. Busy, with ``step = max(step_s ·
    scale, 1e-6)`` and ``age = now - boundary_s``: ``step - fmod(age, step)`` if ``age <=
    phase_steps · step``, nothing awaits a first token there and nothing was sent since the
    boundary; else ``lost_share · step``."""
    for i in range(step_s.shape[0]):
        slot = slot_of_row[i]
        step_by_slot[slot] = step_s[i]
        wait_out[i] = _wait(
            now_s, phase_steps, lost_share, open_requests[i], 0.0 if touched[slot] else batch[i],
            step_s[i], scale[i], boundary_s[slot], sent_s[slot], awaiting[slot],
        )  # fmt: skip


@kernel
def score_rows(
    budget: float,
    spare_others: float,
    spare_decodes: float,
    horizon_s: float,
    tpot_s: float,
    tie_factor: float,
    features: FloatArray,
    predicted: FloatArray,
    rows: FloatArray,
    recent: FloatArray,
    mask: BoolArray,
    profile_of_row: IntArray,
    thetas: FloatArray,
    lateness: FloatArray,
    scores_out: FloatArray,
    near_out: IntArray,
) -> int:
    """TokenPilot's score per row and the rows near its minimum (``TokenPilot.pick``). With
    ``rows`` as ``row_features`` wrote them (P, pairs, B, C, s) and ``recent`` = E:

        q      = (features[:, PREFILL_TOKENS] - P) / budget;  filled = q - floor(q)
        chunk  = min(P, (1 - filled) · budget if filled > 0 else 0)   first chunk joining the last queued step
        own    = (P·a + pairs·b) · lateness(P)                          its own prefill seconds
        room   = horizon_s · max(1 - s / tpot_s, 0)
        harm   = B · (max(E + own - room, 0) - max(E - room, 0))
        score  = predicted + spare_others · chunk · a + spare_decodes · harm

    ``scores_out`` (3 x n) gets chunk, own and the score, on every row. The rows of ``mask``
    whose score is at most ``best · tie_factor + 1e-9`` (best: the lowest of ``mask``'s, the first
    NaN if any) go to ``near_out`` in row order; returns how many."""
    n = predicted.shape[0]
    late_on = lateness[lateness.shape[0] - 1] > 1.0
    best = -1
    nan_seen = False
    for i in range(n):
        theta = thetas[profile_of_row[i]]
        new = rows[0, i]
        steps_queued = (features[i, PREFILL_TOKENS] - new) / budget
        filled = steps_queued - np.floor(steps_queued)
        room = (1.0 - filled) * budget
        if filled <= 0:
            room = 0.0
        chunk = _min(new, room)
        score = predicted[i] + spare_others * (chunk * theta[PREFILL_TOKENS])
        own = new * theta[PREFILL_TOKENS] + rows[1, i] * theta[PREFILL_PAIRS]
        if late_on:
            own *= _lateness_of(new, lateness)
        absorbed = horizon_s * _max(1.0 - rows[4, i] / tpot_s, 0.0)
        harm = rows[2, i] * (_max(recent[i] + own - absorbed, 0.0) - _max(recent[i] - absorbed, 0.0))
        score += spare_decodes * harm
        scores_out[0, i] = chunk
        scores_out[1, i] = own
        scores_out[2, i] = score
        if not mask[i]:
            continue
        # np.argmin over the mask: the first lowest, or the first NaN
        if best < 0 or (not nan_seen and (score != score or score < scores_out[2, best])):
            best = i
            nan_seen = score != score
    if best < 0:
        return 0
    threshold = scores_out[2, best] * tie_factor + 1e-9
    count = 0
    for i in range(n):
        if mask[i] and scores_out[2, i] <= threshold:
            near_out[count] = i
            count += 1
    return count
