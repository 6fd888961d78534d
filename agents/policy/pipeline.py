"""The scheduler: one request's way through admission -> DC selection -> instance selection.

The simulator and the streaming service drive the same ``Scheduler``, so a simulated result is
a statement about the shipped code. It owns the queue pools:

- ``submit(requests, view, now)`` offers new arrivals; ``tick(view, now)`` offers the held
  requests again, whenever ``view.version`` differs from the snapshot they were last offered
  on. A held request is therefore routed at the first snapshot that makes room for it.
- A request is held when admission says ``queue`` (in the pool it names) or when no allowed DC
  has a ready instance of its model (pool ``no_capacity``). Pools are FIFO; a request leaves
  its pool by being routed, rejected, ``withdraw``-n (its client gave up) or expired.
- Holding is bounded (``HoldLimits``): a pool that already holds ``max_per_pool`` requests
  rejects the next one (reason ``queue_full``); a request held longer than ``timeout_s`` is
  rejected (reason ``expired``) by ``expire(now)``, which ``tick`` calls first. No limits by
  default (the simulator's clients give up by themselves); the service sets them.
- ``observe(event)`` forwards first tokens, completions and (to stages that want them) KV events
  to every stage.
- Several deciders per pool (``decide_in_lane(k, n)``, n > 1): arrivals are held (pool
  ``deferred``) a few ``log_delay_s`` after they arrived, then offered as arrivals still
  (``next_wake_s`` says when; the driver calls ``tick`` then), so that the pool's deciders place
  a burst one after another, each seeing in the decision log what the earlier ones placed, as
  one decider places it in its own order (``_log_delays``): decider k waits k delays before the
  arrivals of the class placed first and n + k before the others. While the router decides a
  burst largest first (``OrdersBatch.reorders``: TokenPilot with its cache gate open) the
  long-context prompts go first, so that the short ones go around them; otherwise the short
  ones, so that a long prefill is not put, unseen, ahead of the short prompts another decider
  sent to the same idle instance. Placed unseen at the same instant, two long prompts landed on
  one idle instance, and the first token of one made the other's decider drop the other from
  its queue (Mooncake as shipped, `tokenpilot`, 2 deciders, x2.2: 171 interactive misses against
  one decider's 81, 85 now). A burst's first class waits up to n - 1 delays, the other n to
  2n - 1 (5-35 ms with four deciders on the embedded broker). Held requests likewise: decider k
  offers its own again k log delays after a new snapshot (``_reoffer_waits``), so the deciders
  take the room it shows one after another. One decider defers nothing.

Each offer returns one ``Outcome`` per request that was settled (admitted and placed, or
rejected), plus one for a request held for the first time; a request that stays held on a
re-offer yields nothing new, so callers report each hold once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agents.policy.common.slo import LONG_CONTEXT
from agents.policy.fleetmind.notices import FleetNotice
from agents.policy.stages import (
    AdmissionStage,
    AdmitsAsOffered,
    ClosesLoop,
    DcSelectionStage,
    HoldAware,
    InstanceSelectionStage,
    Noticing,
    OrdersBatch,
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

NO_CAPACITY_POOL = "no_capacity"
DEFERRED_POOL = "deferred"
LOG_DELAY_S = 0.005
"""How late a decider reads the other deciders' placements: the embedded broker's round trip
(``Scheduler.log_delay_s``; the simulator's ``--decision-log-delay`` sets it)."""
_DEFERRED = "deferred: decided once the log shows the other deciders' placements of this instant"


@dataclass(frozen=True, slots=True)
class HoldLimits:
    """How many requests one queue pool may hold, and for how long (seconds); None = no limit."""

    max_per_pool: int | None = None
    timeout_s: float | None = None


@dataclass(slots=True)
class _Held:
    request: RequestView
    pool: str
    reason: str
    since_s: float
    due_s: float | None = None  # deferred until then (``DEFERRED_POOL``), not offered before


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
        self.hold = hold or HoldLimits()
        self.admission = admission
        self.dc_selection = dc_selection
        self.instance_selection = instance_selection
        self._stages = (admission, dc_selection, instance_selection)
        self._kv_stages = tuple(s for s in self._stages if s.wants_kv_events)
        self._held: dict[tuple[str, int], _Held] = {}  # insertion order = FIFO across pools
        self._pool_sizes: dict[str, int] = {}
        self._deferred = 0  # held entries with a due time
        self.lane = (0, 1)  # decider k of the pool's n (``decide_in_lane``)
        self.log_delay_s = LOG_DELAY_S
        self._offered_version = -1
        self._reoffer_s: float | None = None  # decider k's held requests wait for the log until then
        for stage in (admission, dc_selection):
            if isinstance(stage, RouterAware):
                stage.bind_router(instance_selection)
        # The optional capabilities, resolved once: a runtime Protocol check costs ~10 us.
        self._placement_aware = admission if isinstance(admission, PlacementAware) else None
        # The router's batch order only behind an admission that admits as offered (``AdmitsAsOffered``):
        # an admission stage judges each request of an offer behind those it admitted before, in
        # its own serving order (placed in another, SLOMax's regret on the held-out mix at
        # 0.5 x L67 went from 164 to 319; see ``OrdersBatch``). Behind any admission the router
        # says whether an instant's long-context arrivals go before its short ones (``_long_first``).
        router = instance_selection
        self._router_orders = router if isinstance(router, OrdersBatch) else None
        as_offered = isinstance(admission, AdmitsAsOffered) and admission.admits_as_offered
        self._orders_batch = self._router_orders if as_offered else None
        self._hold_aware = admission if isinstance(admission, HoldAware) else None
        self._shares_holds = admission if isinstance(admission, SharesHolds) else None
        self._noticing = tuple(s for s in self._stages if isinstance(s, Noticing))

    def bind_feedback(self, source: GoodputSource, record: Callable[[Any], None] | None = None) -> bool:
        """Bind ``source`` (and ``record`` for each control step) to the admission stage if it
        closes a loop on measured outcomes (``ClosesLoop``); whether it does."""
        if isinstance(self.admission, ClosesLoop):
            self.admission.bind_feedback(source, record)
            return True
        return False

    def decide_in_lane(self, k: int, n: int) -> None:
        """This scheduler is decider ``k`` of its pool's ``n``, and so are its stages that have a
        lane: instance selection breaks near-ties towards its own lane of instances
        (``InstanceSelector.lane``), SLOMax knows its measured error includes the others'
        unseen placements (``SloMax`` docstring)."""
        if not 0 <= k < n:
            raise ValueError(f"decider {k} of {n}: need 0 <= k < n")
        self.lane = (k, n)
        for stage in (self.admission, self.instance_selection):
            if hasattr(stage, "lane"):
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
        with several deciders, some are deferred first (module docstring)."""
        n = self.lane[1]
        if n == 1 or self.log_delay_s <= 0:
            return self._offer(list(requests), view, now_s, arrivals=True)
        delays = self._log_delays(view)
        deferred: list[Outcome] = []
        now = []
        for request in requests:
            wait = delays(request)
            if wait:
                due_s = now_s + wait * self.log_delay_s
                deferred += self._hold(request, DEFERRED_POOL, _DEFERRED, now_s, due_s)
            else:
                now.append(request)
        return deferred + (self._offer(now, view, now_s, arrivals=True) if now else [])

    def _log_delays(self, view: ClusterView) -> Callable[[RequestView], int]:
        """How many log delays an arrival waits at decider k of n (module docstring): k for the
        class placed first, n + k for the other; long-context first while the router decides a
        burst on ``view`` largest first, else the short ones."""
        k, n = self.lane
        long_first = self._long_first(view)
        return lambda request: k + n * ((request.slo_class == LONG_CONTEXT) != long_first)

    def _long_first(self, view: ClusterView) -> bool:
        """Whether an instant's long-context arrivals are placed before its short ones: while the
        router decides a burst on ``view`` largest first (``OrdersBatch.reorders``), so that the
        short ones go around a long prefill rather than a long prefill landing, unseen, behind
        short prompts already sent to an idle instance (whose answers it then slows)."""
        return self._router_orders is not None and self._router_orders.reorders(view)

    def tick(self, view: ClusterView, now_s: float) -> list[Outcome]:
        """Offer the held requests again if ``view`` is a snapshot they have not been offered on
        (decider k of n: k log delays after it came, ``_reoffer_waits``), and the deferred ones
        that are due (``next_wake_s``) in any case."""
        expired = self.expire(now_s)
        if not self._held:
            self._reoffer_s = None
            return expired
        due = self._due(now_s)  # deferred arrivals: placed in the router's order, as arrivals are
        if self._reoffer_waits(view, now_s):
            return expired + (self._offer(due, view, now_s, arrivals=True) if due else [])
        held = [h.request for h in self._held.values() if h.due_s is None]
        return expired + self._offer(held, view, now_s, arrivals=len(held) == len(due))

    def _reoffer_waits(self, view: ClusterView, now_s: float) -> bool:
        """Whether the held requests wait instead of being offered on ``view``: they were offered
        on it already, or this is decider k of n (k > 0) and ``view`` came less than k log delays
        ago. The pool's deciders so take the room a new snapshot shows one after another, each
        having read what the earlier ones placed there, as one decider takes it; offered at once,
        every decider admitted its own held requests into the same room (the synthetic mix at
        x9.0, `slomax+tokenpilot`, 4 deciders: 72 interactive misses against one decider's 29,
        33 now)."""
        if self._reoffer_s is not None:
            if now_s < self._reoffer_s:
                return True
            self._reoffer_s = None
            return False
        if view.version == self._offered_version:
            return True
        k = self.lane[0]
        if k == 0 or self.log_delay_s <= 0 or not self._holds_undeferred():  # (arrivals have their due times)
            return False
        self._reoffer_s = now_s + k * self.log_delay_s
        return True

    def next_wake_s(self) -> float | None:
        """When the earliest deferred request is due, or a held request is to be offered again
        (``_reoffer_waits``): the driver calls ``tick`` then (None: nothing waits)."""
        reoffer_s = self._reoffer_s if self._reoffer_s is not None and self._holds_undeferred() else None
        if not self._deferred:  # no walk over the held requests (thousands under overload)
            return reoffer_s
        due_s = min(h.due_s for h in self._held.values() if h.due_s is not None)
        return due_s if reoffer_s is None else min(due_s, reoffer_s)

    def _holds_undeferred(self) -> bool:
        """Whether a request is held other than a deferred arrival."""
        return len(self._held) > self._deferred

    def expire(self, now_s: float) -> list[Outcome]:
        """Reject (reason ``expired``) every request held longer than ``hold.timeout_s``."""
        timeout = self.hold.timeout_s
        if timeout is None or not self._held:
            return []
        gone = [h for h in self._held.values() if now_s - h.since_s > timeout]
        for entry in gone:
            self._release(entry.request.key)
        return [
            _rejected(h.request, f"expired: held in {h.pool} over {timeout:g} s ({h.reason})") for h in gone
        ]

    def withdraw(self, request_id: str, attempt: int) -> bool:
        """Drop a held request (its client gave up); False if it was not held."""
        if not self._release((request_id, attempt)):
            return False
        if self._hold_aware is not None:
            self._hold_aware.withdrawn((request_id, attempt))
        return True

    def holds(self, key: tuple[str, int]) -> bool:
        """Whether the request attempt ``key`` (``RequestView.key``) is held."""
        return key in self._held

    def held(self) -> dict[str, int]:
        """Requests held, per queue pool."""
        return {pool: n for pool, n in self._pool_sizes.items() if n}

    @property
    def held_total(self) -> int:
        return len(self._held)

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
        self._offered_version = view.version
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
                self._release(request.key)
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
                outcomes += self._hold(request, answer.pool or "default", answer.reason, now_s)
            else:
                choice = self.dc_selection.select(request, view, now_s)
                if choice.reject:
                    self._release(request.key)
                    outcomes.append(_rejected(request, choice.reason))
                elif choice.candidates.any():
                    admitted.append(_Admitted(request, choice, answer.reason, _within(choice, answer)))
                else:
                    outcomes += self._hold(request, NO_CAPACITY_POOL, choice.reason, now_s)
        return outcomes, admitted

    def _place(
        self, admitted: list[_Admitted], view: ClusterView, now_s: float, arrivals: bool
    ) -> list[Outcome]:
        """Instance selection for the admitted requests, as one batch; the outcomes in the order
        placed. A batch of new arrivals is placed in the stage's order if it has one
        (``OrdersBatch``, behind an admission that ``AdmitsAsOffered``); behind another
        admission, in admission's order with the long-context arrivals first while the router would reorder
        (``_long_first``: Mooncake as shipped, `slomax+tokenpilot`, x1.6875, one decider: 92
        interactive TPOT misses -> 47). Held requests offered again keep the order they were
        held in (placing SLOMax's re-offers largest first cost it 4 % of its goodput on Azure's
        code trace at L67)."""
        if arrivals and len(admitted) > 1:
            if self._orders_batch is not None:
                requests = [a.request for a in admitted]
                order = self._orders_batch.order(requests, [a.candidates for a in admitted], view)
                admitted = [admitted[i] for i in order]
            elif self._long_first(view):  # admission's order within each class
                admitted.sort(key=lambda a: a.request.slo_class != LONG_CONTEXT)
        requests = [a.request for a in admitted]
        placements = self.instance_selection.place(requests, [a.candidates for a in admitted], view, now_s)
        outcomes = []
        placement_aware = self._placement_aware
        for entry, placement in zip(admitted, placements, strict=True):
            self._release(entry.request.key)
            row = placement.instance
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
                )
            )
        return outcomes

    def _hold(
        self, request: RequestView, pool: str, reason: str, now_s: float, due_s: float | None = None
    ) -> list[Outcome]:
        """Keep ``request`` in ``pool`` (an outcome only the first time), or reject it when the
        pool is full; ``due_s``: deferred until then."""
        held = self._held.get(request.key)
        if held is not None:  # stays held, keeps its place and its age
            self._pool_sizes[held.pool] -= 1
            self._pool_sizes[pool] = self._pool_sizes.get(pool, 0) + 1
            held.pool, held.reason = pool, reason
            return []
        limit = self.hold.max_per_pool
        if limit is not None and self._pool_sizes.get(pool, 0) >= limit:
            return [_rejected(request, f"queue_full: {pool} holds {limit} requests ({reason})")]
        self._held[request.key] = _Held(request, pool, reason, now_s, due_s)
        self._pool_sizes[pool] = self._pool_sizes.get(pool, 0) + 1
        self._deferred += due_s is not None
        return [Outcome(request, "queue", reason, reason, pool=pool)]

    def _release(self, key: tuple[str, int]) -> bool:
        """Take ``key`` out of its pool; False if it was not held."""
        entry = self._held.pop(key, None)
        if entry is None:
            return False
        self._pool_sizes[entry.pool] -= 1
        self._deferred -= entry.due_s is not None
        return True

    def _due(self, now_s: float) -> list[RequestView]:
        """The deferred requests due by ``now_s``, held as any other from now on."""
        if not self._deferred:
            return []
        due = []
        for entry in self._held.values():
            if entry.due_s is not None and entry.due_s <= now_s:
                entry.due_s = None
                self._deferred -= 1
                due.append(entry.request)
        return due


def _within(choice: DcChoice, answer: Admission) -> BoolArray:
    """The DC's candidates inside admission's share (``Admission.candidates``); the DC's alone
    when admission set none, or when the two do not meet (a share never blocks a request the
    DC selection can place: admission holds a request itself when it must wait)."""
    if answer.candidates is None:
        return choice.candidates
    both = choice.candidates & answer.candidates
    return both if both.any() else choice.candidates


def _rejected(request: RequestView, reason: str) -> Outcome:
    """A reject decided by the scheduler itself; ``reason`` starts with its code."""
    return Outcome(request, "reject", reason, reason)
