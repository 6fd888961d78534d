"""The scheduler: one request's way through admission -> DC selection -> instance selection.

The simulator and the streaming service drive the same ``Scheduler``, so a simulated result is
a statement about the shipped code. Its contract:

- ``submit(requests, view, now)`` offers new arrivals; ``tick(view, now)`` offers the held
  requests again, whenever ``view.version`` differs from the snapshot they were last offered
  on. A held request is therefore routed at the first snapshot that makes room for it.
- A request is held (``agents/policy/pools.py``) when admission says ``queue`` (in the pool it
  names) or when no allowed DC has a ready instance of its model (pool ``no_capacity``), within
  the ``HoldLimits``; ``expire(now)``, which ``tick`` calls first, rejects those held too long.
- ``observe(event)`` forwards first tokens, completions and (to stages that want them) KV events
  to every stage; another decider's hold (``HeldElsewhere``) to the admission stage that counts
  them (``SharesHolds``).
- Several deciders per pool: ``decide_in_lane(k, n, log_delay_s)`` makes this decider k of n
  (``agents/policy/lanes.py``); some arrivals are then deferred (pool ``deferred``) and the held
  requests offered a few log delays after a snapshot. ``next_wake_s`` says when the driver must
  call ``tick`` for them. One decider defers nothing.

Each offer returns one ``Outcome`` per request that was settled (admitted and placed, or
rejected), plus one for a request held for the first time; a request that stays held on a
re-offer yields nothing new, so callers report each hold once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agents.policy.fleetmind.notices import FleetNotice
from agents.policy.lanes import DEFERRED_REASON, Lane
from agents.policy.ordering import ArrivalOrder
from agents.policy.pools import DEFERRED_POOL, NO_CAPACITY_POOL, HoldLimits, QueuePools, rejected
from agents.policy.stages import (
    AdmissionStage,
    ClosesLoop,
    DcSelectionStage,
    DecidesInLane,
    HoldAware,
    InstanceSelectionStage,
    Noticing,
    PlacementAware,
    RouterAware,
    SharesHolds,
)
from agents.policy.types import (
    Admission,
    BlocksChanged,
    BoolArray,
    ClusterView,
    DcChoice,
    HeldElsewhere,
    Observation,
    Outcome,
    RequestView,
)

if TYPE_CHECKING:  # slomax imports this module
    from agents.policy.slomax.feedback import GoodputSource


@dataclass(frozen=True, slots=True)
class _Admitted:
    """A request admission let through, with the DC selection's candidates for it."""

    request: RequestView
    choice: DcChoice
    reason: str  # admission's
    candidates: BoolArray  # the DC's candidates, within admission's share if it set one


class Scheduler:
    """Admission, DC selection and instance selection, composed; see the module docstring."""

    def __init__(
        self,
        name: str,
        admission: AdmissionStage,
        dc_selection: DcSelectionStage,
        instance_selection: InstanceSelectionStage,
        hold: HoldLimits | None = None,
    ) -> None:
        self.name = name
        self.admission = admission
        self.dc_selection = dc_selection
        self.instance_selection = instance_selection
        self.pools = QueuePools(hold)
        self.lane = Lane()
        self._stages = (admission, dc_selection, instance_selection)
        self._kv_stages = tuple(s for s in self._stages if s.wants_kv_events)
        for stage in (admission, dc_selection):
            if isinstance(stage, RouterAware):
                stage.bind_router(instance_selection)
        # The optional capabilities (``agents/policy/stages.py``), resolved once: a runtime
        # Protocol check costs microseconds on every offer.
        self._placement_aware = admission if isinstance(admission, PlacementAware) else None
        self.arrival_order = ArrivalOrder(admission, instance_selection)
        self._hold_aware = admission if isinstance(admission, HoldAware) else None
        self._shares_holds = admission if isinstance(admission, SharesHolds) else None
        self._noticing = tuple(s for s in self._stages if isinstance(s, Noticing))
        self._in_lane = tuple(s for s in (admission, instance_selection) if isinstance(s, DecidesInLane))

    def bind_feedback(self, source: GoodputSource, record: Callable[[Any], None] | None = None) -> bool:
        """Bind ``source`` (and ``record`` for each control step) to the admission stage if it
        closes a loop on observed outcomes (``ClosesLoop``); whether it does."""
        if isinstance(self.admission, ClosesLoop):
            self.admission.bind_feedback(source, record)
            return True
        return False

    def decide_in_lane(self, k: int, n: int, log_delay_s: float) -> None:
        """Make this scheduler decider ``k`` of its pool's ``n``, reading the others' decisions
        ``log_delay_s`` late (``Lane``), and tell the stages that decide in a lane
        (``DecidesInLane``)."""
        self.lane.move(k, n, log_delay_s)
        for stage in self._in_lane:
            stage.lane = (k, n)

    @property
    def wants_kv_events(self) -> bool:
        return bool(self._kv_stages)

    @property
    def wants_holds(self) -> bool:
        """Whether the other deciders' holds (``HeldElsewhere``) change what this one decides."""
        return self._shares_holds is not None

    # --- offers -------------------------------------------------------------------------------

    def submit(self, requests: Sequence[RequestView], view: ClusterView, now_s: float) -> list[Outcome]:
        """Decide new arrivals on ``view`` (see the module docstring for what is returned);
        with several deciders, some are deferred first (``Lane.arrival_wait_s``)."""
        if not self.lane.shared:
            return self._offer(list(requests), view, now_s, arrivals=True)
        long_first = self.arrival_order.long_first(view)
        deferred: list[Outcome] = []
        now = []
        for request in requests:
            wait_s = self.lane.arrival_wait_s(request, long_first)
            if wait_s:
                deferred += self.pools.hold(request, DEFERRED_POOL, DEFERRED_REASON, now_s, now_s + wait_s)
            else:
                now.append(request)
        return deferred + (self._offer(now, view, now_s, arrivals=True) if now else [])

    def tick(self, view: ClusterView, now_s: float) -> list[Outcome]:
        """Offer the held requests again if ``view`` is a snapshot they have not been offered on
        (``Lane.holds_wait``), and the deferred ones that are due (``next_wake_s``) in any case."""
        expired = self.expire(now_s)
        if not self.pools:
            self.lane.nothing_held()
            return expired
        due = self.pools.due(now_s)  # deferred arrivals: placed in the router's order, as arrivals are
        if self.lane.holds_wait(view.version, now_s, self.pools.has_waiting()):
            return expired + (self._offer(due, view, now_s, arrivals=True) if due else [])
        held = list(self.pools.waiting())
        return expired + self._offer(held, view, now_s, arrivals=len(held) == len(due))

    def next_wake_s(self) -> float | None:
        """When the earliest deferred request is due, or the held requests are to be offered
        again (``Lane.holds_wait``): the driver calls ``tick`` then (None: nothing waits)."""
        reoffer_s = self.lane.reoffer_s() if self.pools.has_waiting() else None
        due_s = self.pools.next_due_s()
        if due_s is None or reoffer_s is None:
            return reoffer_s if due_s is None else due_s
        return min(due_s, reoffer_s)

    def expire(self, now_s: float) -> list[Outcome]:
        """Reject (reason ``expired``) every request held longer than ``hold.timeout_s``."""
        return self.pools.expire(now_s)

    def bind_decode(self, request: RequestView, view: ClusterView, decided_id: str, now_s: float) -> str:
        """Where a disaggregated request decodes, now that its KV cache is ready to move
        (``InstanceSelectionStage.bind_decode``)."""
        return self.instance_selection.bind_decode(request, view, decided_id, now_s)

    def withdraw(self, request_id: str, attempt: int) -> bool:
        """Drop a held request (its client gave up); False if it was not held."""
        if not self.pools.release((request_id, attempt)):
            return False
        if self._hold_aware is not None:
            self._hold_aware.withdrawn((request_id, attempt))
        return True

    def holds(self, key: tuple[str, int]) -> bool:
        """Whether the request attempt ``key`` (``RequestView.key``) is held."""
        return key in self.pools

    def held(self) -> dict[str, int]:
        """Requests held, per queue pool."""
        return self.pools.sizes()

    @property
    def held_total(self) -> int:
        return len(self.pools)

    def notices(self) -> list[FleetNotice]:
        """What the stages have to tell operators since the last call (DC state changes,
        reservation moves, replica advice), oldest first."""
        return [n for stage in self._noticing for n in stage.drain_notices()]

    def refresh(self, view: ClusterView, now_s: float) -> None:
        """Let the stages that notice things look at ``view`` now (``Noticing.refresh``)."""
        for stage in self._noticing:
            stage.refresh(view, now_s)

    def observe(self, event: Observation) -> None:
        if isinstance(event, HeldElsewhere):  # the admission stage's business alone
            if self._shares_holds is not None:
                self._shares_holds.held_elsewhere(event)
            return
        stages = self._kv_stages if isinstance(event, BlocksChanged) else self._stages
        for stage in stages:
            stage.observe(event)

    # --- the pipeline ---------------------------------------------------------------------------

    def _offer(
        self, requests: list[RequestView], view: ClusterView, now_s: float, arrivals: bool = False
    ) -> list[Outcome]:
        """Admit, then place, ``requests``: new ``arrivals`` (``submit``) or held requests offered
        again (``tick``)."""
        self.lane.offered(view.version)
        outcomes, admitted = self._admit(requests, view, now_s)
        if admitted:
            outcomes += self._place(admitted, view, now_s, arrivals)
        return outcomes

    def _admit(
        self, requests: list[RequestView], view: ClusterView, now_s: float
    ) -> tuple[list[Outcome], list[_Admitted]]:
        """Admission, then DC selection: outcomes of the requests rejected or newly held, and the
        requests to place with their candidates."""
        outcomes: list[Outcome] = []
        admitted: list[_Admitted] = []
        for request, answer in zip(requests, self.admission.admit(requests, view, now_s), strict=True):
            if answer.action == "reject":
                self.pools.release(request.key)
                outcomes.append(
                    Outcome(
                        request,
                        "reject",
                        answer.reason,
                        answer.reason,
                        predicted_ttft_s=answer.predicted_ttft_s,
                        retry_after_s=answer.retry_after_s,
                    )
                )
            elif answer.action == "queue":
                outcomes += self.pools.hold(request, answer.pool or "default", answer.reason, now_s)
            else:
                choice = self.dc_selection.select(request, view, now_s)
                if choice.reject:
                    self.pools.release(request.key)
                    outcomes.append(rejected(request, choice.reason))
                elif choice.candidates.any():
                    admitted.append(_Admitted(request, choice, answer.reason, _within(choice, answer)))
                else:
                    outcomes += self.pools.hold(request, NO_CAPACITY_POOL, choice.reason, now_s)
        return outcomes, admitted

    def _place(
        self, admitted: list[_Admitted], view: ClusterView, now_s: float, arrivals: bool
    ) -> list[Outcome]:
        """Instance selection for the admitted requests, as one batch; the outcomes in the order
        placed: arrivals in ``ArrivalOrder``, held requests offered again in the order they
        were held in."""
        if arrivals and len(admitted) > 1:
            requests = [a.request for a in admitted]
            order = self.arrival_order.arrange(requests, [a.candidates for a in admitted], view)
            admitted = [admitted[i] for i in order]
        requests = [a.request for a in admitted]
        placements = self.instance_selection.place(requests, [a.candidates for a in admitted], view, now_s)
        outcomes = []
        placement_aware = self._placement_aware
        for entry, placement in zip(admitted, placements, strict=True):
            self.pools.release(entry.request.key)
            row, prefill = placement.instance, placement.prefill_instance
            if placement_aware is not None:
                placement_aware.placed(entry.request, view.instance_ids[row])
            outcomes.append(
                Outcome(
                    entry.request,
                    "admit",
                    placement.reason,
                    entry.reason,
                    dc=entry.choice.dc or str(view.dc[row]),
                    instance=row,
                    instance_id=view.instance_ids[row],
                    predicted_ttft_s=placement.predicted_ttft_s,
                    prefill_instance=prefill,
                    prefill_instance_id=view.instance_ids[prefill] if prefill >= 0 else "",
                )
            )
        return outcomes


def _within(choice: DcChoice, answer: Admission) -> BoolArray:
    """The DC's candidates inside admission's share (``Admission.candidates``); the DC's alone
    when admission set none, or when the two do not meet (a share never blocks a request the
    DC selection can place: admission holds a request itself when it must wait)."""
    if answer.candidates is None:
        return choice.candidates
    both = choice.candidates & answer.candidates
    return both if both.any() else choice.candidates
