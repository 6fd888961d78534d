"""How much later than predicted a prompt of a given size reaches its first token.

The calibrated model (``predictor.py``) is linear in the features of the step-time law it was
written from. An engine whose attention cost per token pair grows with context (long-context
kernels, memory-bound reads) prefills a long prompt slower than any linear fit of that law
predicts, while the many short requests keep the fit right for them (on the simulator's
perturbed engine the longest prompts reach their first token far later than predicted:
docs/results/scoreboard.md, "How TokenPilot got here, round by round"). The queue drain then
declares such an instance free seconds too early, and the interactive requests sent there wait
behind the prompt still prefilling.

What the router sees is enough to measure it. For every completed send whose own prefill was
most of its predicted work (its uncached tokens at least half of the prefill tokens ahead of and
including it) and took at least ``MIN_TOKENS`` (several engine steps), with predicted TTFT p and
observed TTFT y, in its size bucket ``b = min(floor(log2(tokens / MIN_TOKENS)), BUCKETS - 1)``:

    L_b <- (1 - alpha) L_b + alpha log(y / p)          (alpha = 1 / min(n_b, window))
    lateness(b) = max(1, max over b' <= b of exp(L_b'))    (buckets with >= min_samples)

A ratio below 1 is never applied (an early first token already clips the queue), and a larger
prompt is never taken to be relatively faster than a smaller one (the envelope over smaller
buckets also covers a bucket not seen yet). Shorter prompts are left alone: their error is the
phase of the engine step in progress when they arrive, not their size (counted, their lateness
slowed every drain on the default engine). On the nominal law the ratios stay near 1.
"""

from __future__ import annotations

import math

import numpy as np

from agents.policy.common.numeric import FloatArray

MIN_TOKENS = 32768
"""Prompts from here to twice this make the first bucket (four to eight engine steps)."""
BUCKETS = 4


class PrefillLateness:
    def __init__(self, window: int = 64, min_samples: int = 3) -> None:
        self.window = window
        self.min_samples = min_samples
        self._log_ratio = np.zeros(BUCKETS)
        self._count = np.zeros(BUCKETS, dtype=np.int64)
        self.ratio = np.ones(BUCKETS)  # lateness(b), as applied

    def add(self, tokens: float, predicted_s: float, observed_s: float) -> None:
        """One send's own uncached tokens, predicted and observed TTFT (seconds)."""
        if tokens < MIN_TOKENS or predicted_s <= 0 or observed_s <= 0:
            return
        b = bucket(tokens)
        self._count[b] += 1
        alpha = 1.0 / min(int(self._count[b]), self.window)
        self._log_ratio[b] += alpha * (math.log(observed_s / predicted_s) - self._log_ratio[b])
        seen = np.where(self._count >= self.min_samples, np.exp(self._log_ratio), 1.0)
        self.ratio = np.maximum.accumulate(np.maximum(seen, 1.0))

    def of(self, tokens: float) -> float:
        """lateness of a prompt of ``tokens`` uncached tokens (1 below ``MIN_TOKENS``)."""
        return 1.0 if tokens < MIN_TOKENS else float(self.ratio[bucket(tokens)])

    def of_rows(self, tokens: FloatArray) -> FloatArray:
        """``of`` per element."""
        scaled = np.maximum(tokens, 1.0) / MIN_TOKENS
        index = np.clip(np.log2(scaled, out=scaled), 0, BUCKETS - 1).astype(np.int64)
        out: FloatArray = np.where(tokens < MIN_TOKENS, 1.0, self.ratio[index])
        return out


def bucket(tokens: float) -> int:
    """Size bucket of a prompt of at least ``MIN_TOKENS`` uncached tokens."""
    return min(int(math.log2(tokens / MIN_TOKENS)), BUCKETS - 1)
