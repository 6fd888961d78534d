"""What SLOMax measures of time itself: the TTFT its admitted requests recently got (the
prediction of a router that makes none), how long a held request waits to be offered again, and
when interactive work last waited in the pool."""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from agents.policy.types import HeldElsewhere


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


@dataclass(frozen=True, slots=True)
class HeldThere:
    """Another decider's hold: until when it counts at most, when it began, its prompt's size
    and the holder's lane (``HeldElsewhere``)."""

    until_s: float
    time_s: float
    input_tokens: int
    lane: int | None


class WaitingWork:
    """When interactive work last waited in the pool: this decider's own holds (``held``, at
    every offer that holds one) and the other deciders' (``held_elsewhere``, read from the
    admission log). Another decider's hold counts as waiting until its placement is read
    (``placed``), or, if none is, until ``until_s`` (its objective after it began: a held request
    is rejected once it can no longer meet it); one offered here is this decider's own now
    (``offered_here``). ``calm``: none waited within the last ``window_s`` seconds. ``behind``:
    the holds of the deciders that offer after a lane, oldest first."""

    def __init__(self) -> None:
        self.last_s = -math.inf  # when interactive work was last seen waiting
        self.elsewhere: dict[tuple[str, int], HeldThere] = {}  # the others' holds
        self._ends: list[tuple[float, tuple[str, int]]] = []  # heap of (until, key): when each ends

    def held(self, now_s: float) -> None:
        self.last_s = max(self.last_s, now_s)

    def held_elsewhere(self, event: HeldElsewhere, until_s: float) -> None:
        self.elsewhere[event.key] = HeldThere(until_s, event.time_s, event.input_tokens, event.lane)
        heapq.heappush(self._ends, (until_s, event.key))

    def offered_here(self, key: tuple[str, int]) -> None:
        if self.elsewhere:
            self.elsewhere.pop(key, None)

    def placed(self, key: tuple[str, int], at_s: float) -> None:
        """Another decider placed ``key`` at ``at_s``: if it held it, it waited until then."""
        if self.elsewhere and self.elsewhere.pop(key, None) is not None:
            self.held(at_s)

    def calm(self, now_s: float, window_s: float) -> bool:
        self._drop_ended(now_s)
        return not self.elsewhere and now_s - self.last_s > window_s

    def behind(self, lane: int, now_s: float) -> list[tuple[float, int]]:
        """The holds of the deciders in lanes after ``lane`` (they offer later on a snapshot)
        whose size is known: (when each began, its prompt tokens), oldest first."""
        if not self.elsewhere:
            return []
        self._drop_ended(now_s)
        return sorted(
            (h.time_s, h.input_tokens)
            for h in self.elsewhere.values()
            if h.lane is not None and h.lane > lane and h.input_tokens
        )

    def _drop_ended(self, now_s: float) -> None:
        """Forget the others' holds whose objective passed by ``now_s`` (not placed, nor
        offered here, meanwhile): they waited until then."""
        ends = self._ends
        while ends and ends[0][0] <= now_s:
            until_s, key = heapq.heappop(ends)
            entry = self.elsewhere.get(key)
            if entry is not None and entry.until_s == until_s:
                del self.elsewhere[key]
                self.held(until_s)
