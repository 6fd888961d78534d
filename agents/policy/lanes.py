"""Several deciders per pool: when decider k of n offers what arrives and what it holds.

A pool may be served by n deciders (one ``Scheduler`` each). Each reads the others' placements
(``Placed``) and holds (``HeldElsewhere``) from the decision log ``log_delay_s`` after they were
made; two deciders that decide at the same instant do not see each other. ``Lane`` spaces their
decisions so that they act one after another, each having read what the earlier ones placed, as
one decider would:

- **Arrivals** wait ``delays * log_delay_s`` before they are offered (held meanwhile in the pool
  ``DEFERRED_POOL``): ``delays = k`` for the class placed first in a burst, ``n + k`` for the
  other. The long-context arrivals go first while the router orders a burst largest first
  (``OrdersBatch.reorders``: the short ones then go around a long prefill); otherwise the short
  ones, so that no long prefill lands unseen behind short prompts another decider sent to the
  same idle instance. A burst's first class so waits up to n - 1 delays, the other n to 2n - 1.
- **Held requests** are offered again once per new snapshot (``ClusterView.version``); decider k
  waits k log delays after the snapshot came, so the pool's deciders take the room it shows one
  after another instead of all admitting their own holds into the same room.
- The stages that decide differently in a lane (``DecidesInLane``: TokenPilot's tie-break towards
  its own instances, SLOMax's count of the holds of later lanes) are told ``(k, n)``.

One decider (n = 1), or no log delay, defers nothing: every arrival is offered at once and the
held requests once per new snapshot.
"""

from __future__ import annotations

from agents.policy.common.slo import LONG_CONTEXT
from agents.policy.types import RequestView

DEFERRED_REASON = "deferred: decided once the log shows the other deciders' placements of this instant"


class Lane:
    """Decider ``k`` of its pool's ``n``, reading the others' decisions ``log_delay_s`` late; the
    times at which it offers arrivals and held requests (module docstring)."""

    def __init__(self) -> None:
        self.k, self.n, self.log_delay_s = 0, 1, 0.0
        self._offered_version = -1  # the snapshot the held requests were last offered on
        self._reoffer_s: float | None = None  # they wait for the log until then

    def move(self, k: int, n: int, log_delay_s: float) -> None:
        """Become decider ``k`` of ``n``, reading the others ``log_delay_s`` late (what was
        offered and what waits stays as it was)."""
        if not 0 <= k < n:
            raise ValueError(f"decider {k} of {n}: need 0 <= k < n")
        if not log_delay_s >= 0:
            raise ValueError(f"log delay {log_delay_s}: need a number of seconds >= 0")
        self.k, self.n, self.log_delay_s = k, n, log_delay_s

    @property
    def shared(self) -> bool:
        """Whether other deciders' decisions reach this one late (n > 1 and a log delay)."""
        return self.n > 1 and self.log_delay_s > 0

    def arrival_wait_s(self, request: RequestView, long_first: bool) -> float:
        """How long ``request`` waits after it arrived before it is offered (0: at once):
        ``(k + n * [its class is not placed first]) * log_delay_s``."""
        if not self.shared:
            return 0.0
        placed_later = (request.slo_class == LONG_CONTEXT) != long_first
        return (self.k + self.n * placed_later) * self.log_delay_s

    def offered(self, version: int) -> None:
        """Requests were offered on the snapshot ``version``."""
        self._offered_version = version

    def holds_wait(self, version: int, now_s: float, any_waiting: bool) -> bool:
        """Whether the held requests wait instead of being offered on the snapshot ``version``
        now: they were offered on it already, or this is decider k > 0, some are held other
        than deferred arrivals (``any_waiting``) and the snapshot came less than k log delays
        ago (the first call on it starts that wait)."""
        if self._reoffer_s is not None:
            if now_s < self._reoffer_s:
                return True
            self._reoffer_s = None
            return False
        if version == self._offered_version:
            return True
        if self.k == 0 or not self.shared or not any_waiting:
            return False
        self._reoffer_s = now_s + self.k * self.log_delay_s
        return True

    def reoffer_s(self) -> float | None:
        """When the held requests waiting for the log (``holds_wait``) are to be offered."""
        return self._reoffer_s

    def nothing_held(self) -> None:
        """The scheduler holds nothing: no re-offer is pending."""
        self._reoffer_s = None
