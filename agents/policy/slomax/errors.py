"""How wrong SLOMax's TTFT predictions are, measured per class and prompt size.

Every admitted request carries the TTFT admission predicted for it; its first token tells the
TTFT it got. Per (class, prompt-size bucket) the last ``window`` ratios

    r = observed TTFT / predicted TTFT

are kept, and two quantiles of them bound what a new prediction p of that bucket may turn out
to be:

    low(p)  = p x min(q_low(r), 1)      the TTFT it will at least take (rejecting by it is safe)
    high(p) = p x max(q_high(r), 1)     the TTFT it will at most take (holding by it is safe)

with q_low / q_high the ``low_quantile`` / ``high_quantile`` of the bucket's ratios. Buckets are
powers of four of the prompt (< 4k, 4k-16k, 16k-64k, >= 64k tokens): a 100k-token prompt has an
error of its own, not the short prompts' one. A bucket with fewer than ``min_samples`` ratios
borrows its class's pooled ratios, and a class with too few the ``prior`` bounds.
"""

from __future__ import annotations

from collections import deque

import numpy as np

_BUCKET_TOKENS = (4_096, 16_384, 65_536)


def size_bucket(input_tokens: int) -> int:
    """0 .. 3: the prompt-size bucket (edges ``_BUCKET_TOKENS``)."""
    return sum(input_tokens >= edge for edge in _BUCKET_TOKENS)


class _Ratios:
    """The last ``window`` ratios of one bucket, and their quantiles (recomputed every
    ``refresh`` new ratios: quantiles of a few hundred numbers are not free on every offer)."""

    def __init__(self, window: int, quantiles: tuple[float, float], refresh: int = 16) -> None:
        self._ratios: deque[float] = deque(maxlen=window)
        self._quantiles = quantiles
        self._refresh = refresh
        self._since = 0
        self._bounds = (1.0, 1.0)

    def __len__(self) -> int:
        return len(self._ratios)

    def add(self, ratio: float) -> None:
        self._ratios.append(ratio)
        self._since += 1
        if self._since >= self._refresh or len(self._ratios) <= self._refresh:
            self._since = 0
            low, high = np.quantile(np.fromiter(self._ratios, dtype=np.float64), self._quantiles)
            self._bounds = (min(float(low), 1.0), max(float(high), 1.0))

    @property
    def bounds(self) -> tuple[float, float]:
        return self._bounds


class PredictionErrors:
    """``low`` / ``high`` of the module docstring; ``add`` one (predicted, observed) pair."""

    def __init__(
        self,
        low_quantile: float = 0.05,
        high_quantile: float = 0.9,
        window: int = 512,
        min_samples: int = 32,
        prior: tuple[float, float] = (0.5, 1.5),
    ) -> None:
        if not 0.0 <= low_quantile < high_quantile <= 1.0:
            raise ValueError("need 0 <= low_quantile < high_quantile <= 1")
        self._quantiles = (low_quantile, high_quantile)
        self._window = window
        self.min_samples = min_samples
        self.prior = prior
        self._buckets: dict[tuple[str, int], _Ratios] = {}
        self._classes: dict[str, _Ratios] = {}

    def add(self, slo_class: str, input_tokens: int, predicted_s: float, observed_s: float) -> None:
        if not (predicted_s > 0.0 and np.isfinite(predicted_s) and observed_s >= 0.0):
            return
        ratio = observed_s / predicted_s
        for ratios in (
            self._buckets.setdefault((slo_class, size_bucket(input_tokens)), self._new()),
            self._classes.setdefault(slo_class, self._new()),
        ):
            ratios.add(ratio)

    def bounds(self, slo_class: str, input_tokens: int) -> tuple[float, float]:
        """(low, high) ratio bounds for a prediction of this class and prompt size."""
        bucket = self._buckets.get((slo_class, size_bucket(input_tokens)))
        if bucket is not None and len(bucket) >= self.min_samples:
            return bucket.bounds
        pooled = self._classes.get(slo_class)
        if pooled is not None and len(pooled) >= self.min_samples:
            return pooled.bounds
        return self.prior

    def _new(self) -> _Ratios:
        return _Ratios(self._window, self._quantiles)
