"""How wrong SLOMax's TTFT predictions are, per class and prompt size.

Every admitted request carries the TTFT admission predicted for it; its first token tells the
TTFT it got. Per (class, prompt-size bucket) the last ``window`` ratios

    r = observed TTFT / predicted TTFT

are kept, with the last ``window`` lateness d = observed - predicted (seconds), and quantiles of
them bound what a new prediction p of that bucket may turn out to be:

    low(p)  = p x min(q_low(r), 1)                     the TTFT it will at least take
                                                       (rejecting by it is safe)
    high(p) = max(p x max(q_high(r), 1), p + q_high(d))  the TTFT it will at most take
                                                       (admitting by it is safe)

with q_low / q_high the ``low_quantile`` / ``high_quantile``. The ratio bounds a long
prediction; the lateness a short one, whose error is mostly fixed costs a ratio does not scale
(the step in progress on the instance, the way back to the client: a ratio bound alone let
short predictions miss by tens of milliseconds, docs/results/slomax.md). Buckets are
powers of four of the prompt (< 4k, 4k-16k, 16k-64k, >= 64k tokens): a 100k-token prompt has an
error of its own, not the short prompts' one. A bucket with fewer than ``min_samples`` ratios
borrows its class's pooled ratios, and a class with too few the ``prior`` bounds.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple, TypeVar, cast

import numpy as np

from agents.policy.types import FloatArray

Seconds = TypeVar("Seconds", float, FloatArray)

_BUCKET_TOKENS = (4_096, 16_384, 65_536)


def size_bucket(input_tokens: int) -> int:
    """0 .. 3: the prompt-size bucket (edges ``_BUCKET_TOKENS``)."""
    return sum(input_tokens >= edge for edge in _BUCKET_TOKENS)


class ErrorBounds(NamedTuple):
    """A bucket's observed error: ratio bounds ``low`` <= 1 <= ``high`` and ``late_s`` >= 0,
    the ``high_quantile`` of observed - predicted (module docstring)."""

    low: float
    high: float
    late_s: float = 0.0

    def at_least(self, predicted: float) -> float:
        """low(p): the TTFT a prediction of ``predicted`` seconds will at least take."""
        return self.low * predicted

    def at_most(self, predicted: Seconds) -> Seconds:
        """high(p): the TTFT it will at most take (element-wise for an array of predictions)."""
        return cast(Seconds, np.maximum(self.high * predicted, predicted + self.late_s))


class _Errors:
    """The last ``window`` errors of one bucket, and their quantiles (recomputed every
    ``refresh`` new errors: quantiles of a few hundred numbers are not free on every offer)."""

    def __init__(self, window: int, quantiles: tuple[float, float], refresh: int = 16) -> None:
        self._ratios: deque[float] = deque(maxlen=window)
        self._late: deque[float] = deque(maxlen=window)
        self._quantiles = quantiles
        self._refresh = refresh
        self._since = 0
        self._bounds = ErrorBounds(1.0, 1.0)

    def __len__(self) -> int:
        return len(self._ratios)

    def add(self, predicted_s: float, observed_s: float) -> None:
        self._ratios.append(observed_s / predicted_s)
        self._late.append(observed_s - predicted_s)
        self._since += 1
        if self._since >= self._refresh or len(self._ratios) <= self._refresh:
            self._since = 0
            low, high = np.quantile(np.fromiter(self._ratios, dtype=np.float64), self._quantiles)
            late = np.quantile(np.fromiter(self._late, dtype=np.float64), self._quantiles[1])
            self._bounds = ErrorBounds(min(float(low), 1.0), max(float(high), 1.0), max(float(late), 0.0))

    @property
    def bounds(self) -> ErrorBounds:
        return self._bounds


_PRIOR = ErrorBounds(0.5, 1.5)  # before a class has ``min_samples`` errors


class PredictionErrors:
    """``bounds`` of one class and prompt size; ``add`` one (predicted, observed) pair."""

    def __init__(
        self,
        low_quantile: float = 0.05,
        high_quantile: float = 0.9,
        window: int = 512,
        min_samples: int = 32,
        prior: ErrorBounds = _PRIOR,
    ) -> None:
        if not 0.0 <= low_quantile < high_quantile <= 1.0:
            raise ValueError("need 0 <= low_quantile < high_quantile <= 1")
        self._quantiles = (low_quantile, high_quantile)
        self._window = window
        self.min_samples = min_samples
        self.prior = prior
        self._buckets: dict[tuple[str, int], _Errors] = {}
        self._classes: dict[str, _Errors] = {}

    def add(self, slo_class: str, input_tokens: int, predicted_s: float, observed_s: float) -> None:
        if not (predicted_s > 0.0 and np.isfinite(predicted_s) and observed_s >= 0.0):
            return
        for errors in (
            self._buckets.setdefault((slo_class, size_bucket(input_tokens)), self._new()),
            self._classes.setdefault(slo_class, self._new()),
        ):
            errors.add(predicted_s, observed_s)

    def bounds(self, slo_class: str, input_tokens: int) -> ErrorBounds:
        """The observed error of a prediction of this class and prompt size."""
        bucket = self._buckets.get((slo_class, size_bucket(input_tokens)))
        if bucket is not None and len(bucket) >= self.min_samples:
            return bucket.bounds
        pooled = self._classes.get(slo_class)
        if pooled is not None and len(pooled) >= self.min_samples:
            return pooled.bounds
        return self.prior

    def _new(self) -> _Errors:
        return _Errors(self._window, self._quantiles)
