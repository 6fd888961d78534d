"""SLOMax's control loop: admission thresholds and capacity shares, adjusted from observed goodput.

Every ``interval_s`` the loop reads the last ``span_s`` of per-class outcomes (``GoodputSource``)
and moves two knobs of the admission stage:

- ``headroom`` in [``headroom_min``, 1]: an interactive request is admitted while its predicted
  TTFT (plus the time it already waited) is at most ``headroom`` x its class objective;
- ``batch_share`` in [``share_min``, ``share_max``]: the share of the pool's in-flight token
  capacity batch work may hold while the pool is saturated (below saturation it takes any
  idle capacity: work-conserving).

The law, with ``m`` = the interactive met share of the window (attempts that met their
objective / attempts that ended) and target ``target`` (0.99):

    m < target - band                 -> tighten: batch_share x (1 - step), headroom - step/2
    m >= target and batch is at risk  -> loosen batch: batch_share x (1 + step)
    m >= target                       -> relax headroom: headroom + step/2 (up to its default)
    otherwise (inside the band)       -> hold

where "batch is at risk" = some batch attempt of the window missed its deadline or timed out.
Steps are bounded (each knob moves at most ``step`` relative per interval and stays in its
range). Hysteresis: the first move *against* the previous one is only made after ``dwell``
consecutive windows asking for it; a single noisy window cannot reverse the loop. So after a
step change of load the knobs move monotonically to the new operating point and stop there
(no limit cycle: a reversal costs ``dwell`` intervals, and inside the dead band nothing moves).

Stale or missing feedback (no interactive attempt ended in the window, or the newest event is
older than ``stale_after_s``): the loop holds its last state. It never halts admission: the
knobs only ever change how much is admitted, within ranges that always admit something.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agents.policy.common.slo import BATCH, INTERACTIVE
from agents.policy.slomax.feedback import ClassWindow


@dataclass(frozen=True, slots=True)
class Knobs:
    headroom: float = 0.65
    batch_share: float = 0.3


@dataclass(frozen=True, slots=True)
class Step:
    """One control step, as written back to ClickHouse (``slomax_adjustments``)."""

    time_s: float
    action: str  # tighten | loosen_batch | relax_headroom | hold | stale
    interactive_met_share: float | None
    batch_misses: int
    before: Knobs
    after: Knobs
    reason: str


@dataclass(slots=True)
class Controller:
    target: float = 0.99
    band: float = 0.01
    step: float = 0.2
    dwell: int = 2
    headroom_min: float = 0.1
    share_min: float = 0.05
    share_max: float = 0.9
    interval_s: float = 10.0
    span_s: float = 60.0
    stale_after_s: float = 60.0
    knobs: Knobs = Knobs()
    default: Knobs = Knobs()
    last: Step | None = None
    _direction: int = 0  # +1 loosened last, -1 tightened last, 0 none yet
    _asked: int = 0  # consecutive windows asking for a reversal

    def update(self, windows: dict[str, ClassWindow], now_s: float) -> Step:
        """Apply the law to one window (see the module docstring); returns the step taken."""
        interactive = windows.get(INTERACTIVE, ClassWindow(INTERACTIVE))
        batch = windows.get(BATCH, ClassWindow(BATCH))
        met = interactive.met_share
        misses = (batch.finished - batch.met) + batch.timeouts
        before = self.knobs
        if met is None or interactive.newest_s is None or now_s - interactive.newest_s > self.stale_after_s:
            return self._record(
                now_s, "stale", met, misses, before, before, "no fresh interactive outcome: hold"
            )
        if met < self.target - self.band:
            action, direction = "tighten", -1
            after = replace(
                before,
                batch_share=max(self.share_min, before.batch_share * (1 - self.step)),
                headroom=max(self.headroom_min, before.headroom - self.step / 2),
            )
            reason = f"interactive met {met:.3f} < {self.target - self.band:.3f}"
        elif misses > 0:
            action, direction = "loosen_batch", +1
            after = replace(before, batch_share=min(self.share_max, before.batch_share * (1 + self.step)))
            reason = f"interactive met {met:.3f}; {misses} batch attempts missed their deadline"
        elif met >= self.target and before.headroom < self.default.headroom:
            action, direction = "relax_headroom", +1
            after = replace(before, headroom=min(self.default.headroom, before.headroom + self.step / 2))
            reason = f"interactive met {met:.3f} >= {self.target:.3f}"
        else:
            self._asked = 0
            return self._record(now_s, "hold", met, misses, before, before, "inside the dead band")
        if self._direction and direction != self._direction:
            self._asked += 1
            if self._asked < self.dwell:
                waits = f"{reason}; the reversal waits ({self._asked}/{self.dwell})"
                return self._record(now_s, "hold", met, misses, before, before, waits)
        self._asked = 0
        self._direction = direction
        self.knobs = after
        return self._record(now_s, action, met, misses, before, after, reason)

    def _record(
        self,
        now_s: float,
        action: str,
        met: float | None,
        misses: int,
        before: Knobs,
        after: Knobs,
        reason: str,
    ) -> Step:
        self.last = Step(now_s, action, met, misses, before, after, reason)
        return self.last
