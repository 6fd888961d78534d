"""What SLOMax measures of time itself: the TTFT its admitted requests recently got (the
prediction of a router that makes none) and how long a held request waits to be offered again."""

from __future__ import annotations


class ObservedTtft:
    """The fallback prediction for a router that has none: per class, the recent TTFT its
    admitted requests got (an exponential average, weight ``alpha`` per first token), decaying
    by half every ``half_life_s`` without a new first token, so a loop that stopped admitting
    because the average was high cannot stay stuck on it."""

    def __init__(self, alpha: float = 0.1, half_life_s: float = 2.0) -> None:
        self.alpha, self.half_life_s = alpha, half_life_s
        self._mean: dict[str, tuple[float, float]] = {}  # class -> (average, when last updated)

    def add(self, slo_class: str, ttft_s: float, time_s: float) -> None:
        old = self.wait_s(slo_class, time_s)
        self._mean[slo_class] = (old + self.alpha * (ttft_s - old), time_s)

    def wait_s(self, slo_class: str, now_s: float) -> float:
        mean, at = self._mean.get(slo_class, (0.0, now_s))
        return float(mean * 0.5 ** (max(now_s - at, 0.0) / self.half_life_s))


class ReofferGap:
    """How long until a held request is offered again: the mean time between new snapshots
    (an exponential average, weight ``alpha`` per new version, starting at ``initial_s``)."""

    def __init__(self, alpha: float = 0.1, initial_s: float = 0.25) -> None:
        self.alpha = alpha
        self.gap_s = initial_s
        self._version = -1
        self._at: float | None = None

    def seen(self, version: int, now_s: float) -> None:
        if version == self._version:
            return
        if self._at is not None:
            self.gap_s += self.alpha * (now_s - self._at - self.gap_s)
        self._version, self._at = version, now_s
