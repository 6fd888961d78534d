"""What SLOMax's control loop reads: per-class outcomes over a recent window.

``GoodputSource.window(now_s, span_s)`` returns one ``ClassWindow`` per class with any event in
``(now_s - span_s, now_s]``. Production reads it from ClickHouse (the tables the feedback agent
writes: ``infra/clickhouse/goodput.py``); the simulator from the same ClickHouse tables or from
``InMemoryGoodput`` below, fed with the same records. Both count the same way:

- ``finished`` / ``met``: attempts that ended on an instance (any status) / of those, status ok
  and every threshold of the class met (``met_slo``, as the sink stores it);
- ``output_tokens`` / ``good_tokens``: output tokens of those attempts / of the met ones;
- ``timeouts`` / ``aborted``: ended with status ``timeout`` / ``aborted``; ``retries``: ended
  attempts numbered 2 or more; ``rejected``: admission rejects decided in the window;
- ``newest_s``: the newest event time counted, so the controller can tell stale feedback.

Times are compared in whole milliseconds, truncated, as the store keeps them (DateTime64(3)), so
both sources put an event on the same side of a window's edge.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ClassWindow:
    slo_class: str
    finished: int = 0
    met: int = 0
    output_tokens: int = 0
    good_tokens: int = 0
    timeouts: int = 0
    aborted: int = 0
    retries: int = 0
    rejected: int = 0
    newest_s: float | None = None

    @property
    def compliant_share(self) -> float | None:
        """good tokens / output tokens (None: nothing generated in the window)."""
        return self.good_tokens / self.output_tokens if self.output_tokens else None

    @property
    def met_share(self) -> float | None:
        """Attempts that met their objective / attempts that ended (None: none ended)."""
        return self.met / self.finished if self.finished else None


class GoodputSource(Protocol):
    def window(self, now_s: float, span_s: float) -> dict[str, ClassWindow]: ...


def _ms(time_s: float) -> int:
    return int(time_s * 1000)


@dataclass(frozen=True, slots=True)
class _Ended:
    time_ms: int
    slo_class: str
    status: str
    met: bool
    output_tokens: int
    attempt: int


class InMemoryGoodput:
    """A ``GoodputSource`` kept in memory; events older than ``keep_s`` are forgotten."""

    def __init__(self, keep_s: float = 600.0) -> None:
        self.keep_s = keep_s
        self._ended: deque[_Ended] = deque()
        self._rejects: deque[tuple[float, str]] = deque()

    def completed(
        self, time_s: float, slo_class: str, status: str, met: bool, output_tokens: int, attempt: int
    ) -> None:
        """One attempt ended on an instance (records arrive in time order)."""
        self._ended.append(_Ended(_ms(time_s), slo_class, status, met, output_tokens, attempt))
        self._forget(time_s)

    def rejected(self, time_s: float, slo_class: str) -> None:
        self._rejects.append((_ms(time_s), slo_class))
        self._forget(time_s)

    def window(self, now_s: float, span_s: float) -> dict[str, ClassWindow]:
        start, end = _ms(now_s - span_s), _ms(now_s)
        totals: dict[str, dict[str, float]] = {}
        for e in self._ended:
            if start < e.time_ms <= end:
                t = totals.setdefault(e.slo_class, _zero())
                t["finished"] += 1
                t["met"] += e.met
                t["output_tokens"] += e.output_tokens
                t["good_tokens"] += e.output_tokens if e.met else 0
                t["timeouts"] += e.status == "timeout"
                t["aborted"] += e.status == "aborted"
                t["retries"] += e.attempt > 1
                t["newest_s"] = max(t["newest_s"], e.time_ms / 1000)
        for time_ms, slo_class in self._rejects:
            if start < time_ms <= end:
                t = totals.setdefault(slo_class, _zero())
                t["rejected"] += 1
                t["newest_s"] = max(t["newest_s"], time_ms / 1000)
        return {name: _window(name, t) for name, t in totals.items()}

    def _forget(self, now_s: float) -> None:
        horizon = _ms(now_s - self.keep_s)
        while self._ended and self._ended[0].time_ms < horizon:
            self._ended.popleft()
        while self._rejects and self._rejects[0][0] < horizon:
            self._rejects.popleft()


_COUNTS = ("finished", "met", "output_tokens", "good_tokens", "timeouts", "aborted", "retries", "rejected")


def _zero() -> dict[str, float]:
    return {**dict.fromkeys(_COUNTS, 0.0), "newest_s": float("-inf")}


def _window(name: str, t: dict[str, float]) -> ClassWindow:
    newest = t["newest_s"]
    counts = {k: int(t[k]) for k in _COUNTS}
    return ClassWindow(name, **counts, newest_s=None if newest == float("-inf") else newest)
