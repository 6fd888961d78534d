"""An attempt's life on an instance, the same in the discrete-event loop (``sim/loop/runner.py``)
and the real-time driver of the emulated fleet (``sim/loop/live.py``).

- step end: the instance finishes its step; the attempts that got their first token in it start
  streaming (their client sees it ``return_s`` later: ``first_token_s``), then the attempts
  that ended end, then the instance plans its next step;
- give-up: a give-up due now applies while the attempt is pending, not already being aborted,
  and its client still waits (``ClientRules.still_gives_up``). On an instance the attempt is
  aborted where it is: waiting, it ends at once (``aborted``); running, at the end of the step
  in progress;
- end: the client sees the end ``return_s`` later (``end_s``); what the attempt reports
  (``Measures``): its status, TTFT, TPOT and E2E, taken at the client
  (``agents/policy/common/timing.py``).

Where the news goes differs: the loop tells its scheduler (``FirstToken``, ``Finished``), the
driver emits events (``ResponseStarted``, ``Completion``). Each implements the three hooks
``_started``, ``_ended`` and ``_after``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from agents.policy.common import timing
from agents.policy.common.slo import SloClass, meets_slo
from sim.engine.attempt import Attempt
from sim.engine.instance import Instance
from sim.loop.clients import ClientRules
from sim.workloads.trace import TraceRequest

ReportedStatus = Literal["ok", "timeout", "error"]
REPORTED_STATUS: dict[str, ReportedStatus] = {"ok": "ok", "aborted": "timeout"}
"""What an ended attempt reports, by its status (any other: ``error``): an attempt its client
gave up on timed out; one refused or failed is an error."""


@dataclass(frozen=True, slots=True)
class Measures:
    """What an ended attempt reports, at the client (durations unclamped; None: none taken)."""

    status: ReportedStatus
    ttft_s: float | None  # None: no first token
    tpot_s: float | None  # None: no first token, or one token
    e2e_s: float | None  # None: never ended on an instance

    @classmethod
    def of(cls, attempt: Attempt) -> Measures:
        first, end = attempt.first_token_s, attempt.end_s
        return cls(
            REPORTED_STATUS.get(attempt.status, "error"),
            timing.ttft(first, attempt.arrival_s),
            timing.tpot(first, end, attempt.generated),
            None if end is None else end - attempt.arrival_s,
        )


def deadline_at(request: TraceRequest) -> float | None:
    """The request's absolute deadline (its own is relative to its first arrival)."""
    return None if request.deadline_s is None else request.arrival_s + request.deadline_s


def met_objective(attempt: Attempt, measures: Measures, slo: SloClass | None) -> bool:
    """Whether the ended attempt met its class's objective ``slo`` (as the feedback sink
    judges a completion: finished ok, and its TTFT, TPOT and deadline within the class's)."""
    ttft, e2e = measures.ttft_s, measures.e2e_s
    if measures.status != "ok" or slo is None or ttft is None or e2e is None:
        return False
    deadline = deadline_at(attempt.request)
    relative = None if deadline is None else deadline - attempt.arrival_s
    return meets_slo(slo, ttft, measures.tpot_s, e2e, relative)


class AttemptLifecycle(ABC):
    """The transitions both drivers share; they call ``_step_ended``, ``_abort_on`` and ``_end``
    and implement the hooks."""

    clients: ClientRules

    def _gives_up(self, attempt: Attempt) -> bool:
        """Whether a give-up due now for ``attempt`` still applies."""
        if attempt.status != "pending" or attempt.abort_requested:
            return False
        return self.clients.still_gives_up(attempt)

    def _step_ended(self, instance: Instance, now: float) -> None:
        """``instance``'s step ends at ``now`` (a one-token response starts and ends at once)."""
        ended = instance.finish_step(now)
        for attempt in instance.first_tokens:
            attempt.first_token_s = now + attempt.return_s  # when the client (and router) see it
            self._started(instance, attempt, attempt.first_token_s - attempt.arrival_s, now)
        instance.first_tokens.clear()
        for attempt in ended:
            self._end(attempt, now)
        self._after(instance, now)

    def _abort_on(self, attempt: Attempt, instance: Instance, now: float) -> None:
        """The client gives up on ``attempt``, which is on ``instance``: waiting, it leaves now;
        running, it ends at the end of the step in progress."""
        if instance.abort(attempt, now):
            attempt.status = "aborted"
            self._end(attempt, now)
        self._after(instance, now)

    def _end(self, attempt: Attempt, now: float) -> None:
        """``attempt`` ended at ``now`` (its status set); its client sees it ``return_s`` later."""
        attempt.end_s = now + attempt.return_s
        self._ended(attempt, now)

    @abstractmethod
    def _started(self, instance: Instance, attempt: Attempt, ttft_s: float, now: float) -> None:
        """``attempt`` got its first token on ``instance`` at ``now``; its client sees it
        ``ttft_s`` after its arrival."""

    @abstractmethod
    def _ended(self, attempt: Attempt, now: float) -> None:
        """``attempt`` ended at ``now`` (``end_s`` set): report it (``Measures.of``)."""

    @abstractmethod
    def _after(self, instance: Instance, now: float) -> None:
        """``instance`` changed at ``now``: schedule its next step end, forward its KV events."""
