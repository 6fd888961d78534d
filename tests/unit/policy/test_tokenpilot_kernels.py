"""TokenPilot's compiled kernels compute bit for bit what their numpy formulas compute.

Each reference below is the numpy code the kernel replaced (``router.py``, ``queues.py``,
``stepclock.py`` before they were compiled), run on random states with the awkward cases mixed
in: several engine profiles, rows late on their oldest send, a lateness above 1, masked rows,
ties, idle instances. Equality is exact (``np.array_equal``): a kernel that reorders one
operation fails here before it moves a decision.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agents.policy.common import compiled
from agents.policy.tokenpilot import kernels
from agents.policy.tokenpilot.lateness import BUCKETS, MIN_TOKENS, PrefillLateness

ROOT = Path(__file__).resolve().parents[3]
N = 97
BUDGET = 8192.0
THETAS = np.array(
    [
        [0.01, 4e-5, 8e-8, 3e-5, 1.5e-9, 0.01, 1.0],
        [0.012, 3.3e-5, 9.1e-8, 3.7e-5, 2.2e-9, 0.02, 0.7],
        [0.0071, 0.0, 1.3e-7, 2.9e-5, 0.0, 0.0, 1.3],
    ]
)


def lateness_ratio(rng: np.random.Generator, late: bool) -> np.ndarray:
    if not late:
        return np.ones(BUCKETS)
    return np.maximum.accumulate(1.0 + rng.random(BUCKETS))


def of_rows(ratio: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """``PrefillLateness.of_rows`` with ``ratio`` (its reference is the class itself)."""
    lateness = PrefillLateness()
    lateness.ratio = ratio
    return lateness.of_rows(tokens)


def state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = np.where(rng.random(N) < 0.3, 0.0, rng.random(N) * 200_000)
    return {
        "profile": rng.integers(0, len(THETAS), N).astype(np.int64),
        "tokens": tokens,
        "pairs": tokens * rng.random(N) * 50_000,
        "as_of": 100.0 - rng.random(N) * 2,
        "recent": rng.random(N) * 3,
        "head_due": np.where(rng.random(N) < 0.5, np.inf, 100.0 + rng.normal(0, 0.5, N)),
        "head_tokens": np.where(rng.random(N) < 0.5, 0.0, rng.random(N) * 300_000),
        "head_depth": rng.random(N) * 400_000,
        "running": rng.integers(0, 64, N).astype(np.int64),
        "tokens_in_flight": rng.integers(0, 500_000, N).astype(np.int64),
        "free": rng.integers(-100, 8000, N).astype(np.int64),
        "sent": np.where(rng.random(N) < 0.5, 0, rng.integers(0, 5, N)).astype(np.int64),
        "sent_tokens": rng.integers(0, 50_000, N).astype(np.int64),
        "matched": np.where(rng.random(N) < 0.4, 0, rng.integers(0, 300, N)).astype(np.int64),
    }


@pytest.mark.parametrize("seed", range(6))
def test_queue_pace_and_drain_are_the_numpy_drain(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    s, ratio = state(seed), lateness_ratio(rng, late=seed % 2 == 1)
    now, horizon = 100.0 + rng.random(), 4.0 * rng.random() + 0.1
    batch, context = s["running"] + s["sent"], s["tokens_in_flight"] + s["sent_tokens"]
    # reference: TokenPilot._queued, then PrefillQueues.drain
    pairs_per_step = BUDGET * s["pairs"] / np.maximum(s["tokens"], 1.0)
    step_ref = np.empty(N)
    for k, theta in enumerate(THETAS):
        rows = np.flatnonzero(s["profile"] == k)
        t0, per_seq, per_context, per_token, per_pair = theta[:5]
        step_ref[rows] = (
            (t0 + per_token * BUDGET)
            + per_seq * batch[rows]
            + per_context * context[rows]
            + per_pair * pairs_per_step[rows]
        )
    if ratio[-1] > 1.0:
        step_ref *= of_rows(ratio, s["head_tokens"])
    step = np.empty(N)
    counts = np.array([s["running"], s["tokens_in_flight"], s["free"]])
    kernels.queue_pace(
        BUDGET, s["tokens"], s["pairs"], s["head_tokens"], counts, s["sent"], s["sent_tokens"],
        s["profile"], THETAS, ratio, step,
    )  # fmt: skip
    assert np.array_equal(step, step_ref)

    ref = {k: s[k].copy() for k in ("tokens", "pairs", "as_of", "recent")}
    elapsed = np.maximum(now - ref["as_of"], 0.0)
    done = elapsed * BUDGET / np.maximum(step, 1e-6)
    ref["recent"] *= np.exp(-elapsed / horizon)
    left = np.maximum(1.0 - done / np.maximum(ref["tokens"], 1e-9), 0.0)
    np.minimum(left, 1.0, out=left)
    ref["tokens"] *= left
    ref["pairs"] *= left
    late = s["head_due"] + step < now
    assert np.count_nonzero(late)
    floor = np.where(late, np.minimum(s["head_tokens"], BUDGET), 0.0)
    np.maximum(ref["pairs"], floor * (s["head_depth"] - floor * 0.5), out=ref["pairs"])
    np.maximum(ref["tokens"], floor, out=ref["tokens"])
    np.maximum(ref["as_of"], now, out=ref["as_of"])

    decay = np.empty(N)
    kernels.decay_exponent(now, horizon, s["as_of"], decay)
    np.exp(decay, out=decay)
    kernels.drain(
        now, BUDGET, step, decay, s["tokens"], s["pairs"], s["as_of"], s["recent"],
        s["head_due"], s["head_tokens"], s["head_depth"],
    )  # fmt: skip
    for key, value in ref.items():
        assert np.array_equal(s[key], value), key


@pytest.mark.parametrize("seed", range(6))
def test_row_features_boundary_wait_and_score_are_the_numpy_formulas(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    s, ratio = state(seed), lateness_ratio(rng, late=seed % 2 == 0)
    input_tokens = float(rng.integers(1, 160_000))
    output_budget = float(rng.integers(1, 4096))
    blocks_needed = float(-(-(int(input_tokens) + int(output_budget)) // 512))
    queued, queued_pairs = s["tokens"], s["pairs"]

    # reference: TokenPilot._features and _decode_step
    cached = np.multiply(s["matched"], np.float64(512))
    np.minimum(cached, input_tokens - 1, out=cached)
    new = input_tokens - cached
    own_pairs = new * (cached + new * 0.5)
    batch = s["running"] + s["sent"]
    context = s["tokens_in_flight"] + s["sent_tokens"]
    ref = np.empty((N, 7))
    total = np.add(queued, new, out=ref[:, 3])
    steps = np.divide(total, BUDGET, out=ref[:, 0])
    np.ceil(steps, out=steps)
    np.multiply(steps, batch, out=ref[:, 1])
    np.multiply(steps, context, out=ref[:, 2])
    np.add(queued_pairs, own_pairs, out=ref[:, 4])
    short = np.float64(blocks_needed) - s["matched"]
    short -= s["free"]
    unseen = s["sent"] * np.float64(output_budget)
    unseen += s["sent_tokens"]
    unseen /= np.float64(512)
    short += unseen
    np.maximum(short, 0.0, out=ref[:, 5])
    step_ref = np.empty(N)
    for k, theta in enumerate(THETAS):
        rows = np.flatnonzero(s["profile"] == k)
        step_ref[rows] = theta[0] + theta[1] * batch[rows] + theta[2] * context[rows]

    # reference: StepClock.wait (slots in reverse row order: the gather path)
    now, phase_steps, lost_share = 100.0, 2.0, 0.5
    slot_of_row = np.arange(N)[::-1].copy()
    open_requests = np.where(rng.random(N) < 0.5, 0, rng.integers(0, 3, N)).astype(np.int64)
    scales = 1.0 + rng.random(len(THETAS))
    scale = scales[s["profile"]]
    boundary = np.where(rng.random(N) < 0.2, -np.inf, now - rng.random(N) * 0.3)
    sent_s = boundary + rng.normal(0, 0.05, N)
    awaiting = np.where(rng.random(N) < 0.7, 0, 1).astype(np.int64)
    touched = rng.random(N) < 0.6
    b, sent_b, aw, to = (x[slot_of_row] for x in (boundary, sent_s, awaiting, touched))
    busy = (open_requests > 0) | ((batch > 0) & ~to)
    step = np.maximum(step_ref * scale, 1e-6)
    wait_ref = np.where(busy, lost_share * step, 0.0)
    age = now - b
    known = (age <= phase_steps * step) & busy & (aw == 0) & (sent_b <= b)
    assert np.count_nonzero(known) and np.count_nonzero(busy & ~known) and np.count_nonzero(~busy)
    wait_ref[known] = step[known] - np.fmod(age[known], step[known])
    ref[:, 6] = wait_ref

    counts = np.array([s["running"], s["tokens_in_flight"], s["free"]])
    features, rows_out, step_by_slot = np.empty((N, 7)), np.empty((5, N)), np.zeros(N)
    kernels.row_features(
        input_tokens, blocks_needed, output_budget, BUDGET, now, phase_steps, lost_share, s["matched"],
        counts, s["sent"], s["sent_tokens"], queued, queued_pairs, open_requests, s["profile"], THETAS,
        scales, slot_of_row, boundary, sent_s, awaiting, touched, step_by_slot, features, rows_out,
    )  # fmt: skip
    assert np.array_equal(features, ref)
    for got, want in zip(rows_out, (new, own_pairs, batch, context, step_ref), strict=True):
        assert np.array_equal(got, want)
    assert np.array_equal(step_by_slot[slot_of_row], step_ref)
    wait, step_by_slot = np.empty(N), np.zeros(N)
    kernels.boundary_wait(
        now, phase_steps, lost_share, open_requests, rows_out[2], rows_out[4], scale, slot_of_row,
        boundary, sent_s, awaiting, touched, step_by_slot, wait,
    )  # fmt: skip
    assert np.array_equal(wait, wait_ref)
    assert np.array_equal(step_by_slot[slot_of_row], step_ref)

    # reference: TokenPilot.pick's scores and near-ties (kernels.score_rows)
    predicted = np.empty(N)
    for k, theta in enumerate(THETAS):
        rows = np.flatnonzero(s["profile"] == k)
        predicted[rows] = features[rows] @ theta
    steps_queued = features[:, 3] - new
    steps_queued /= BUDGET
    filled = steps_queued - np.floor(steps_queued)
    room = np.subtract(1.0, filled)
    room *= BUDGET
    room[filled <= 0] = 0.0
    chunk = np.minimum(new, room)
    per_token = THETAS[s["profile"], 3]
    spare_others, spare_decodes, horizon, tpot, tolerance = 1.0, 3.0, 2.5, 0.1, 0.02
    score = predicted + spare_others * (chunk * per_token)
    own_s = new * per_token + own_pairs * THETAS[s["profile"], 4]
    if ratio[-1] > 1.0:
        own_s *= of_rows(ratio, new)
    absorbed = horizon * np.maximum(1.0 - step_ref / tpot, 0.0)
    recent = s["recent"]
    harm = batch * (np.maximum(recent + own_s - absorbed, 0.0) - np.maximum(recent - absorbed, 0.0))
    score += spare_decodes * harm
    mask = rng.random(N) < 0.8
    masked = np.where(mask, score, np.inf)
    best = masked[masked.argmin()]
    near_ref = (masked <= best * (1 + tolerance) + 1e-9).nonzero()[0]

    scores, near = np.empty((3, N)), np.empty(N, dtype=np.int64)
    count = kernels.score_rows(
        BUDGET, spare_others, spare_decodes, horizon, tpot, 1 + tolerance, features, predicted,
        rows_out, recent, mask, s["profile"], THETAS, ratio, scores, near,
    )  # fmt: skip
    assert np.array_equal(scores[0], chunk)
    assert np.array_equal(scores[1], own_s)
    assert np.array_equal(scores[2], score)  # every row's (a disaggregation prices the others)
    assert np.array_equal(near[:count], near_ref)


def test_ties_and_a_single_candidate() -> None:
    features, rows = np.zeros((4, 7)), np.zeros((5, 4))
    predicted = np.array([2.0, 1.0, 1.0 + 1e-12, 1.0])
    scores, near = np.empty((3, 4)), np.empty(4, dtype=np.int64)
    args = (1.0, 3.0, 4.0, 0.1, 1.0, features, predicted, rows, np.zeros(4))
    tail = (np.zeros(4, dtype=np.int64), THETAS[:1], np.ones(BUCKETS), scores, near)
    count = kernels.score_rows(BUDGET, *args, np.ones(4, dtype=bool), *tail)
    assert near[:count].tolist() == [1, 2, 3]
    count = kernels.score_rows(BUDGET, *args, np.array([True, False, False, False]), *tail)
    assert near[:count].tolist() == [0]


def test_lateness_buckets_match_the_class() -> None:
    ratio = np.array([1.5, 2.0, 2.5, 3.0])
    tokens = np.array(
        [0.0, MIN_TOKENS - 1, MIN_TOKENS, 2 * MIN_TOKENS - 1e-9, 2 * MIN_TOKENS, 4 * MIN_TOKENS, 1e9]
    )
    step = np.empty(len(tokens))
    zeros = np.zeros(len(tokens), dtype=np.int64)
    one_step = np.zeros(len(tokens))
    theta = np.array([[1.0, 0, 0, 0, 0, 0, 0]])
    counts = np.zeros((3, len(tokens)), dtype=np.int64)
    kernels.queue_pace(BUDGET, one_step, one_step, tokens, counts, zeros, zeros, zeros, theta, ratio, step)
    assert np.array_equal(step, of_rows(ratio, tokens))


def test_kernels_are_cached_on_disk_and_loaded_from_there(tmp_path: Path) -> None:
    """A first process compiles into NUMBA_CACHE_DIR; the next one loads every kernel it uses
    from there and compiles none."""
    script = (
        "import numpy as np\n"
        "from agents.policy.tokenpilot import kernels\n"
        "from tests.unit.policy.test_tokenpilot_kernels import test_ties_and_a_single_candidate\n"
        "test_ties_and_a_single_candidate()\n"
        "stats = kernels.score_rows.stats\n"
        "print(sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))\n"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    runs = [
        subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert runs[0].stdout.split() == ["0", "1"]  # compiled, then written
    assert runs[1].stdout.split() == ["1", "0"]  # loaded
    assert list(tmp_path.rglob("*.nbi"))


def test_a_kernel_is_cached_elsewhere_when_numba_has_nowhere_to_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """numba refuses ``cache=True`` where it can write neither beside the source nor in the
    user's cache directory: the kernel is then cached in a directory of ours."""
    import numba
    from numba.core import config

    calls: list[str] = []

    def njit(cache: bool) -> object:
        calls.append(config.CACHE_DIR)
        if cache and not config.CACHE_DIR:
            raise RuntimeError("cannot cache function 'f': no locator available for file 'f.py'")
        return lambda func: func

    monkeypatch.setattr(config, "CACHE_DIR", "")
    monkeypatch.setattr(numba, "njit", njit)
    compiled._njit(lambda: None)
    assert calls == ["", compiled.fallback_cache_dir()]


def test_numba_is_loaded_by_the_first_kernel_call_not_by_importing_the_policy() -> None:
    script = (
        "import sys\n"
        "import agents.policy, agents.policy.common.prefix_index, agents.policy.tokenpilot.kernels\n"
        "print('numba' in sys.modules)\n"
        "from tests.unit.policy.test_tokenpilot_kernels import test_ties_and_a_single_candidate\n"
        "test_ties_and_a_single_candidate()\n"
        "from agents.policy.tokenpilot import kernels\n"
        "print('numba' in sys.modules, type(kernels.score_rows).__name__, type(kernels._max).__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["False", "True", "CPUDispatcher", "CPUDispatcher"]
