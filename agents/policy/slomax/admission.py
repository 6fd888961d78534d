"""SLOMax: tiered admission by predicted feasibility, queue pools per class, capacity shares.

For each offer (new arrivals, and the held requests again at every new snapshot) the requests
are considered in serving order:

    (tier, its tenant not crowded out, class rank, tenant's virtual token counter, slack)

class rank: interactive 0, long_context 1, batch 2 (a batch request whose deadline is near,
``urgent`` below, ranks 0); slack = objective - waited (interactive, long_context) or deadline -
now - output budget x ``tpot_estimate_s`` (batch). With ``ttft`` the predicted TTFT were the
request sent now and ``wait`` the part of it spent waiting (all but its own prefill on an idle
instance), each request gets one answer:

- ``reject`` ``cannot_meet_slo`` when its objective is out of reach even if sent now, and even
  at the low end of the prediction's observed error (``errors.py``: per class and prompt size,
  low(ttft) = ttft x the 5th percentile of observed / predicted TTFT, at most 1): waited +
  low(ttft) > its class's TTFT objective; for batch, now + ttft + output budget x ``tpot_estimate_s`` > its
  deadline. A held request that becomes so is rejected with ``expired``: a held request is
  re-judged at every offer with what it has already waited.
  ``over_quota``: the tenant's tokens in flight (input + output budget) would pass
  ``tenant_quota_tokens`` (a tenant holding nothing is always let through once). Rejects carry
  ``retry_after_s`` where trying again could succeed (how late the prediction is).
- ``admit`` when the request is feasible and its class's gate is open:
    interactive:  ttft <= headroom x objective (1.3 s of a 2 s objective by default) and
                  waited + high(ttft) <= objective: the high end of the prediction's own
                  observed error (``errors.py``, below) for its class and prompt size, not
                  one margin for all (a fixed margin beside it let long interactive prompts
                  expire that ``tokenpilot`` served: docs/results/slomax.md). The pool
                  estimate (below) has no per-row error: there the bound is
                  (objective - waited) / (1 + ``ttft_margin``), 25 % of what is left
    long_context: the same with long_headroom (4.5 s of 15 s), and an instance prefills
                  fewer than ``long_prefills_per_instance`` long prompts: the request may only be
                  placed on such an instance (``Admission.candidates``)
    batch:        urgent (slack < ``deadline_margin_s``), or the pool is not saturated (ttft <=
                  ``saturation`` x the interactive objective and no interactive request waits),
                  or batch work in flight + this request stays within ``batch_share`` of the
                  pool's token capacity (work-conserving: below saturation batch takes whatever
                  is idle)
  and in every class, an instance with prefill room for the request's own prefill: one whose
  decodes would still produce a token within ``tpot_headroom`` x the interactive TPOT objective
  (``placement.py``); the request may only be placed on such rows (urgent batch: anywhere),
  and, interactive and long context, only on the rows where its own predicted TTFT passes the
  gate: the router prices more than TTFT (the harm its prefill does to decodes), so the
  instance with the lowest TTFT may lack prefill room, or the router may prefer another, and an
  admission judged on one row and placed on another misses its objective more often
  (docs/results/slomax.md, "Why the gates are where they are")
- ``queue`` in the pool named after its class otherwise: offered again at the next snapshot.

The rule that keeps admission free when there is room: a gate may hold a request only while
holding it costs nothing, to it or to the others.

- A request is *due* when it could not afford another hold: waited + gap + high(ttft) >
  objective, with gap the mean time between snapshots (when it would be offered again) and
  high(ttft) >= ttft the high end of its bucket's observed error: the larger of ttft x the
  90th percentile of observed / predicted TTFT and ttft + the 90th percentile of observed -
  predicted (a short prediction's error is mostly fixed costs, which a ratio does not scale).
- The headroom gate guards the request itself (a margin for prediction error), so a due request
  passes it. The prefill-room gate guards the decodes of the instance: a due request may take
  the room left below the TPOT objective itself instead of below its ``tpot_headroom``, where
  its prefill slows the decodes without making them miss, unless an interactive request ahead
  of it in serving order waits in the same offer (that room is then theirs: fair shares hold).
  The long-prompt gates (the share of instances, ``long_headroom``) guard interactive work, so
  they yield to a long prompt while no interactive request has been held in the last
  ``prefill_window_s`` (nothing waits that it could cost), here or by another decider of the
  pool (below).
- Every admit, let past a gate or not, goes only to rows where waited + high(ttft) meets its
  objective; with none it stays held, and is rejected only once even the low end misses.
  Without a router's per-row prediction (the pool estimate below) only a request let past a
  gate is held to it: the pool estimate is the same for every row and moves only as the
  class's recent TTFT does, so holding a request for a better one gains nothing, and its
  error is so wide that the test would hold every request that waited until it expired
  (docs/results/slomax.md, "The predictor stopped learning the holds").
  With several deciders, when no row would meet it at the high end even for its own prefill
  alone (a hold that could only end in ``expired``), it goes where its point prediction meets
  its objective: a decider's observed error then mostly counts the other deciders' unseen
  placements of the same instant (``waiver.py``). One decider keeps the high-end test (there
  the same rule raised the regret below capacity: docs/results/scoreboard.md).

So at normal load every gate opens before a request's objective is gone, and a reject means the
request would most likely have missed anyway; under overload (interactive work waiting, no room
below the TPOT objective) the gates hold as before. Judged by ``rejected_met_without_admission``
against the same router without admission (``sim/evaluation/regret.py``, ``python -m
bench.goodput_curve``).

Why the gates are on the predicted TTFT well below the objective, and on prefill room: a
request admitted into a long queue meets its own TTFT, but its prefill then runs beside the
decodes of its instance, and prefill chunks are what stretch time per output token (with the
TTFT gate at the objective itself, admitted requests miss their TPOT instead: docs/results/
slomax.md, "Why the gates are where they are"). Long prompts (seconds of prefill over many
engine steps) are the strongest such interference, hence their own, tighter gate and their
share of the instances.

``ttft`` is the router's own prediction per row (``predict_rows``, TokenPilot's calibrated
model) where the router has one, else, on every row alike, what the class's admitted requests
recently got (``timing.ObservedTtft``) plus the request's prompt at ``prefill_tokens_per_s`` (no cache
knowledge); where one number is needed (the reject test, the batch gate) it is the lowest over
the rows that serve the request's model. Within one offer, what was admitted before a request is
added to its prediction the same way (the router places the admitted requests only after
admission). Running work is never pre-empted: SLOMax only decides what starts.

Several deciders per pool: another decider's admitted and placed request, read from the
decision log (``Placed``), is counted exactly as an own admit once placed: its class's and
tenant's tokens in flight (quota, batch share), its fair-queuing charge, its prefill seconds on
its instance (prefill room; the router's own-prefill prediction on that row from the last
snapshot, before the router credits its prefix there, else its prompt at
``prefill_tokens_per_s``) and, for a long prompt, its place in the long-prompt share; its first
token and its end release them as for an own request. So every decider's quotas, shares and
fairness are the pool's, not its partition's. And the pool's waiting work is every decider's:
a hold another decider begins (``HeldElsewhere``, read from the admission log) of an interactive
request counts for the calm test as an own hold until its placement is read, or, if none is, until
its objective has passed (a held request is rejected once it can no longer meet it).
Decider k offers a snapshot's room before the deciders of later lanes (``Scheduler``: k log
delays after it came), so it would take room their older holds need: in serving order, before
a request of its offer it counts each hold of a later lane's decider that began before the
request arrived as admitted ahead of it (its prompt at ``prefill_tokens_per_s``, charged to every
ready row's prefill room and to the next predictions, as an admit of the same offer), so the
pool's oldest work takes the room first, whichever decider holds it (without it, several
deciders kept less goodput than one under overload: docs/results/scoreboard.md, "The pool's
oldest holds take a snapshot's room first").

Tenants inside a tier are served by token-weighted fair queuing (``fairness.py``), and no tenant
is crowded out by another's flood: while a tenant holds more than its weighted part of the
pool's tokens in flight, the tenants below their own part (``fairness.under_share``) are served
first, whatever their class, and a batch request that keeps its tenant within its part passes
the saturated batch gate. With one tenant, or every tenant near its part, nothing changes.
(They do not take the prefill room below the TPOT objective itself, as a due request does:
that costs goodput under overload; docs/results/slomax.md, "Fairness".) ``headroom`` and
``batch_share`` are moved by the control loop (``controller.py``) from the goodput observed
through a ``GoodputSource`` (``bind_feedback``); without one they keep their defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from agents.policy.common.slo import (
    BATCH,
    DEFAULT_SLO_CLASSES,
    INTERACTIVE,
    LONG_CONTEXT,
    LONG_CONTEXT_INPUT_TOKENS,
    SloClass,
)
from agents.policy.slomax.classes import Classified, ClassRules
from agents.policy.slomax.controller import Controller, Knobs, Step
from agents.policy.slomax.errors import PredictionErrors
from agents.policy.slomax.fairness import VirtualTokenCounter, under_share
from agents.policy.slomax.feedback import GoodputSource
from agents.policy.slomax.in_flight import InFlight
from agents.policy.slomax.placement import PrefillLoad, Rows
from agents.policy.slomax.timing import ObservedTtft, ReofferGap, WaitingWork
from agents.policy.slomax.waiver import Waiver, at_best
from agents.policy.types import (
    BLOCK_TOKENS,
    Admission,
    BoolArray,
    ClusterView,
    Finished,
    FirstToken,
    HeldElsewhere,
    Observation,
    Placed,
    RequestView,
    RowPrediction,
    RowPredictor,
)

_RANK = {INTERACTIVE: 0, LONG_CONTEXT: 1, BATCH: 2}
_NO_ROOM = "no instance has prefill room: more would slow its decodes past the TPOT objective"


_CALM = "no interactive work waits"


@dataclass(slots=True)
class _Offer:
    index: int
    request: RequestView
    cls: Classified
    rank: int
    slack_hint: float  # a cheap slack (no prediction) to order by


class SloMax:
    name = "slomax"
    wants_kv_events = False

    def __init__(
        self,
        seed: int = 0,
        long_input_tokens: int = LONG_CONTEXT_INPUT_TOKENS,
        long_output_tokens: int | None = None,
        tenant_tiers: Mapping[str, int] | None = None,
        tenant_classes: Mapping[str, str] | None = None,
        tenant_weights: Mapping[str, float] | None = None,
        headroom: float = 0.65,
        long_headroom: float = 0.3,
        batch_share: float = 0.3,
        saturation: float = 0.25,
        long_prefills_per_instance: int = 1,
        long_share: float = 0.25,
        tpot_headroom: float = 0.7,
        prefill_window_s: float = 4.0,
        ttft_margin: float = 0.25,
        deadline_margin_s: float = 60.0,
        tpot_estimate_s: float = 0.05,
        prefill_tokens_per_s: float = 40_000.0,
        tenant_quota_tokens: int | None = None,
        vtc_input_weight: float = 1.0,
        vtc_output_weight: float = 2.0,
        control_interval_s: float = 10.0,
        control_span_s: float = 60.0,
    ) -> None:
        del seed  # deterministic
        self.rules = ClassRules(
            long_input_tokens=long_input_tokens,
            long_output_tokens=long_output_tokens,
            tenant_tiers=dict(tenant_tiers or {}),
            tenant_classes=dict(tenant_classes or {}),
            tenant_weights=dict(tenant_weights or {}),
        )
        self.slo: dict[str, SloClass] = dict(DEFAULT_SLO_CLASSES)
        knobs = Knobs(headroom, batch_share)
        self.controller = Controller(
            knobs=knobs, default=knobs, interval_s=control_interval_s, span_s=control_span_s
        )
        self.saturation = saturation
        self.long_headroom = long_headroom
        self.long_prefills_per_instance = long_prefills_per_instance
        self.long_share = long_share
        self.tpot_headroom = tpot_headroom
        self.prefill = PrefillLoad(prefill_window_s)
        self._now = 0.0
        self.deadline_margin_s = deadline_margin_s
        self.ttft_margin = ttft_margin
        self.tpot_estimate_s = tpot_estimate_s
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.tenant_quota_tokens = tenant_quota_tokens
        self.fair = VirtualTokenCounter(vtc_input_weight, vtc_output_weight)
        self._router: RowPredictor | None = None
        self._source: GoodputSource | None = None
        self._record: Callable[[Step], None] | None = None
        self._next_control_s: float | None = None
        self.in_flight = InFlight(self.fair, self.prefill)
        self._held: set[tuple[str, int]] = set()
        self._observed = ObservedTtft()
        self.errors = PredictionErrors()
        self._reoffer = ReofferGap()
        self.waiting = WaitingWork()  # when interactive work last waited, here or elsewhere
        self.lane = (0, 1)  # decider k of the pool's n (``Scheduler.decide_in_lane``)
        self._backlogged: set[str] = set()  # tenants with requests in the previous offer
        self._under: dict[str, int] = {}  # tenants below their fair part (fairness.under_share)
        self._mask_key: tuple[int, str] = (-1, "")
        self._view: ClusterView | None = None  # the last snapshot offered (for others' placements)
        self._mask: BoolArray = np.zeros(0, dtype=bool)
        self.counts: dict[str, int] = {}  # answers by action and reason code (for metrics)

    # --- wiring ---------------------------------------------------------------------------------

    def bind_router(self, router: object) -> None:
        """Use the router's TTFT prediction where it has one (``Scheduler`` calls this)."""
        self._router = router if isinstance(router, RowPredictor) else None

    def bind_feedback(self, source: GoodputSource, record: Callable[[Step], None] | None = None) -> None:
        """Close the loop: read outcomes from ``source`` every ``interval_s``; ``record`` each step."""
        self._source, self._record = source, record

    @property
    def knobs(self) -> Knobs:
        return self.controller.knobs

    def control(self, now_s: float) -> Step | None:
        """One control step if one is due (called at every offer; cheap when not due)."""
        if self._source is None:
            return None
        if self._next_control_s is None:
            self._next_control_s = now_s + self.controller.interval_s
            return None
        if now_s < self._next_control_s:
            return None
        self._next_control_s = now_s + self.controller.interval_s
        step = self.controller.update(self._source.window(now_s, self.controller.span_s), now_s)
        if self._record is not None:
            self._record(step)
        return step

    # --- deciding -------------------------------------------------------------------------------

    def admit(self, requests: Sequence[RequestView], view: ClusterView, now_s: float) -> list[Admission]:
        self._now = now_s  # the placements of this offer follow it at the same instant
        self._view = view
        self.control(now_s)
        self._reoffer.seen(view.version, now_s)
        answers: list[Admission | None] = [None] * len(requests)
        offers = [self._offer(i, r, now_s) for i, r in enumerate(requests)]
        active = {o.request.tenant for o in offers}
        for tenant in active - self._backlogged:  # back after a gap: no credit for idleness
            self.fair.lift(tenant, self._backlogged & active)
        self._backlogged = active
        ready = max(int(view.ready.sum()), 1)
        capacity = int(view.kv_total[view.ready].sum()) * BLOCK_TOKENS
        self._under = under_share(self.in_flight.tenant_tokens, active, self.rules.tenant_weights)
        offers.sort(
            key=lambda o: (
                o.cls.tier,
                o.request.tenant not in self._under,
                o.rank,
                self.fair.counter(o.request.tenant),
                o.slack_hint,
            )
        )
        pending = 0  # prefill tokens admitted in this offer, not yet seen by the router
        tpot = self._tpot_objective()
        room, due_room = self.prefill.room(view, now_s, self.tpot_headroom * tpot, tpot)
        long_on = self.in_flight.long_on
        rows = Rows(view, long_on, self.long_prefills_per_instance, self.long_share, room, due_room)
        interactive_waits = False
        batch_closed = False  # a batch request was refused its gate: later ones are too
        behind = self.waiting.behind(self.lane[0], now_s) if self.lane[1] > 1 else []
        older = 0  # the holds of ``behind`` that went before the requests of this offer so far
        for offer in offers:
            request, cls = offer.request, offer.cls
            self.waiting.offered_here(request.key)  # (its partition changed hands: ours now)
            while older < len(behind) and behind[older][0] < request.arrival_s:
                tokens = behind[older][1]  # an older hold, offered after this decider: room for it
                older += 1
                pending += tokens
                rows.taken(INTERACTIVE, view.ready, tokens / self.prefill_tokens_per_s)
            if batch_closed and cls.slo_class == BATCH and offer.rank == _RANK[BATCH]:
                answers[offer.index] = self._queue(request, BATCH, "batch gate closed: the pool is saturated")
                continue
            predicted = self._predict(offer, view, now_s, ready, pending)
            answer = self._decide(offer, predicted, now_s, capacity, interactive_waits, rows)
            if answer.action == "admit":
                _, own = at_best(predicted, answer.candidates)  # its prefill where it likely runs
                pending += request.input_tokens
                rows.taken(cls.slo_class, answer.candidates, own)
                self._admitted(request, cls, own, answer.predicted_ttft_s, now_s)
            elif answer.action == "queue":
                if cls.slo_class == INTERACTIVE:
                    interactive_waits = True
                    self.waiting.held(now_s)
                batch_closed |= cls.slo_class == BATCH
            answers[offer.index] = answer
            self._count(answer)
        return [a for a in answers if a is not None]

    def _offer(self, index: int, request: RequestView, now_s: float) -> _Offer:
        cls = self.rules.classify(request)
        rank = _RANK[cls.slo_class]
        if cls.slo_class == BATCH:
            slack = self._batch_slack(request, now_s, 0.0)
            if slack < self.deadline_margin_s:
                rank = 0  # urgent: served with interactive work
        else:
            slack = self._objective_of(cls.slo_class) - (now_s - request.arrival_s)
        return _Offer(index, request, cls, rank, slack)

    def _decide(
        self,
        offer: _Offer,
        predicted: RowPrediction,
        now_s: float,
        capacity: int,
        interactive_waits: bool,
        rows: Rows,
    ) -> Admission:
        request, cls = offer.request, offer.cls
        name = cls.slo_class
        ttft, _ = at_best(predicted)
        if ttft == np.inf:  # no ready instance serves its model (yet): wait for one
            return self._queue(request, name, f"no ready instance serves {request.model}")
        held = request.key in self._held
        quota = self.tenant_quota_tokens
        holds = self.in_flight.tenant_tokens.get(request.tenant, 0)
        need = request.input_tokens + request.output_budget  # what it would hold in flight
        if quota is not None and holds and holds + need > quota:
            detail = f"tenant {request.tenant} holds {holds} of its {quota} tokens in flight"
            return self._reject(request, "over_quota", detail, 1.0)
        if name == BATCH:
            slack = self._batch_slack(request, now_s, ttft)
            if slack < 0:
                code = "expired" if held else "cannot_meet_slo"
                detail = f"deadline out of reach by {-slack:.1f} s"
                return self._reject(request, code, detail, None, ttft)
            urgent = slack < self.deadline_margin_s
            saturated = interactive_waits or ttft > self.saturation * self._objective_of(INTERACTIVE)
            share = self.knobs.batch_share * capacity
            part = self._under.get(request.tenant, -1)  # its tenant's fair part, if crowded out
            gates = (
                (urgent, "urgent"),
                (not saturated, "idle capacity"),
                (self.in_flight.class_tokens.get(BATCH, 0) + need <= share, "within batch share"),
                (holds + need <= part, "within its tenant's fair share"),
            )
            why = next((reason for opened, reason in gates if opened), "")
            if why:
                where = rows.for_request(name, predicted.own_s, urgent)
                if where is None:
                    return self._queue(request, BATCH, _NO_ROOM, ttft)
                ttft, _ = at_best(predicted, where)
                return self._admit(f"slomax: batch {why}", ttft, where)
            return self._queue(request, BATCH, f"batch gate closed: predicted TTFT {ttft:.2f} s", ttft)
        objective = self._objective_of(name)
        waited = now_s - request.arrival_s
        error = self.errors.bounds(name, request.input_tokens)
        least = error.at_least(ttft)
        if waited + least > objective:
            code = "expired" if held else "cannot_meet_slo"
            detail = (
                f"waited {waited:.2f} s + predicted TTFT {ttft:.2f} s (at least {least:.2f} s) "
                f"> {objective:g} s objective"
            )
            return self._reject(request, code, detail, waited + least - objective, ttft)
        # The gates below may hold a request only while holding it is free (module docstring).
        due = waited + self._reoffer.gap_s + error.at_most(ttft) > objective
        calm = not interactive_waits and self._calm(now_s)
        why = "a hold would miss its objective" if due else _CALM
        past = Waiver(name, predicted, waited, objective, error, why)
        if name == LONG_CONTEXT and not rows.long_room():
            reason = "every instance is prefilling its share of long prompts"
            return (
                self._past(request, past, reason, None, ttft)
                if calm
                else self._queue(request, name, reason, ttft)
            )
        where = rows.for_request(name, predicted.own_s)
        if where is None:
            # Due, it may take the room below the TPOT objective itself, unless interactive work
            # ahead of it in serving order waits (then that room is theirs: fair shares hold).
            may_take = due and not interactive_waits
            where = rows.for_request(name, predicted.own_s, due=True) if may_take else None
            if where is None:
                return self._queue(request, name, _NO_ROOM, ttft)
            return self._past(request, past, _NO_ROOM, where, ttft)
        headroom = self.knobs.headroom if name == INTERACTIVE else self.long_headroom
        limit = headroom * objective
        if predicted.per_row:  # bounded by its observed error (module docstring)
            fits = where & (predicted.ttft_s <= limit) & past.meets(predicted.ttft_s)
            bound = "headroom and measured error"
        else:  # the pool estimate: a fixed share of what is left
            limit = min(limit, (objective - waited) / (1.0 + self.ttft_margin))
            fits = where & (predicted.ttft_s <= limit)
            bound = "headroom and margin"
        if not fits.any():
            ttft, _ = at_best(predicted, where)
            reason = f"predicted TTFT {ttft:.2f} s over {limit:.2f} s ({bound})"
            if due or (name == LONG_CONTEXT and calm):
                return self._past(request, past, reason, where, ttft)
            return self._queue(request, name, reason, ttft)
        ttft, _ = at_best(predicted, fits)
        return self._admit(f"slomax: {name} within headroom", ttft, fits)

    def _calm(self, now_s: float) -> bool:
        """No interactive request was held within the last ``prefill.tau_s`` seconds, here or
        by another decider of the pool."""
        return self.waiting.calm(now_s, self.prefill.tau_s)

    def held_elsewhere(self, event: HeldElsewhere) -> None:
        """Another decider holds an interactive request: it waits (module docstring)."""
        if event.slo_class == INTERACTIVE and event.key not in self.in_flight:
            self.waiting.held_elsewhere(event, event.time_s + self._objective_of(INTERACTIVE))

    def _past(
        self, request: RequestView, past: Waiver, gate: str, where: BoolArray | None, ttft: float
    ) -> Admission:
        """A request let past the ``gate`` that would hold it: admitted onto the rows of ``where``
        (None: any that serves it) where it most likely meets its objective (``Waiver.rows``);
        held if there are none (it expires once even the low end misses)."""
        predicted = past.predicted
        rows = past.rows(np.isfinite(predicted.ttft_s) if where is None else where, self.lane[1] > 1)
        if not rows.any():
            return self._queue(request, past.slo_class, gate, ttft)
        ttft, _ = at_best(predicted, rows)
        return self._admit(f"slomax: gate waived, {past.why} ({gate})", ttft, rows)

    def _predict(
        self, offer: _Offer, view: ClusterView, now_s: float, ready: int, pending: int
    ) -> RowPrediction:
        """Per row, the router's prediction (else the pool estimate), plus this offer's earlier
        admits; infinite on rows that do not serve the request's model."""
        request = offer.request
        queued_s = pending / (ready * self.prefill_tokens_per_s)
        serves = self._model_mask(request, view)
        if self._router is not None and serves.any():
            predicted = self._router.predict_rows(request, view, now_s)
            return RowPrediction(np.where(serves, predicted.ttft_s + queued_s, np.inf), predicted.own_s)
        own_s = request.input_tokens / self.prefill_tokens_per_s
        wait = self._observed.wait_s(offer.cls.slo_class, now_s) + queued_s
        return RowPrediction(np.where(serves, wait + own_s, np.inf), np.full(len(view), own_s), per_row=False)

    def _model_mask(self, request: RequestView, view: ClusterView) -> BoolArray:
        key = (view.version, request.model)
        if key != self._mask_key:
            self._mask_key, self._mask = key, view.ready & (view.model == request.model)
        return self._mask

    def _tpot_objective(self) -> float:
        tpot = self.slo[INTERACTIVE].tpot_s
        return float("inf") if tpot is None else tpot

    def _objective_of(self, name: str) -> float:
        ttft = self.slo[name].ttft_s
        return float("inf") if ttft is None else ttft

    def _batch_slack(self, request: RequestView, now_s: float, predicted: float) -> float:
        if request.deadline_s is None:
            return float("inf")
        service = predicted + request.output_budget * self.tpot_estimate_s
        return request.deadline_s - now_s - service

    # --- answers and accounting -------------------------------------------------------------------

    def _admit(self, reason: str, ttft: float, candidates: BoolArray | None) -> Admission:
        return Admission("admit", reason, predicted_ttft_s=ttft, candidates=candidates)

    def _queue(
        self, request: RequestView, pool: str, reason: str, predicted: float | None = None
    ) -> Admission:
        self._held.add(request.key)
        return Admission("queue", f"slomax: {reason}", pool=pool, predicted_ttft_s=predicted)

    def _reject(
        self,
        request: RequestView,
        code: str,
        detail: str,
        retry_after_s: float | None,
        predicted: float | None = None,
    ) -> Admission:
        self._held.discard(request.key)
        hint = "" if retry_after_s is None else f"; retry after {retry_after_s:.1f} s"
        return Admission(
            "reject", f"{code}: {detail}{hint}", predicted_ttft_s=predicted, retry_after_s=retry_after_s
        )

    def _admitted(
        self, request: RequestView, cls: Classified, prefill_s: float, predicted: float | None, now_s: float
    ) -> bool:
        """Count an admitted request in flight (False: it already was)."""
        self._held.discard(request.key)
        return self.in_flight.admit(request, cls.slo_class, cls.weight, prefill_s, predicted, now_s)

    def _count(self, answer: Admission) -> None:
        code = answer.reason.split(":", 1)[0] if answer.action == "reject" else answer.action
        self.counts[code] = self.counts.get(code, 0) + 1

    def observe(self, event: Observation) -> None:
        if isinstance(event, Placed):
            self._placed_elsewhere(event)
        elif isinstance(event, FirstToken):
            entry = self.in_flight.first_token((event.request_id, event.attempt))
            if entry is not None:
                self._observed.add(entry.slo_class, event.ttft_s, event.time_s)
                if entry.predicted_s is not None:
                    got = event.ttft_s - entry.waited_s  # from the admission it predicted for
                    self.errors.add(entry.slo_class, entry.input_tokens, entry.predicted_s, got)
        elif isinstance(event, Finished):
            key = (event.request_id, event.attempt)
            self._held.discard(key)
            self.in_flight.finish(key, event.output_tokens)

    def placed(self, request: RequestView, instance_id: str) -> None:
        self.in_flight.place(request.key, instance_id, self._now)

    def _placed_elsewhere(self, event: Placed) -> None:
        """Another decider admitted and placed ``event.request`` (module docstring)."""
        request = event.request
        self.waiting.placed(request.key, event.time_s)  # (if another's hold: it ended now)
        cls = self.rules.classify(request)
        prefill_s = self._prefill_on(request, event.instance_id, event.time_s)
        if self._admitted(request, cls, prefill_s, None, event.time_s):
            self.in_flight.place(request.key, event.instance_id, event.time_s)

    def _prefill_on(self, request: RequestView, instance_id: str, now_s: float) -> float:
        """The request's own prefill seconds on ``instance_id``: the router's prediction on the
        last snapshot offered, else its prompt at ``prefill_tokens_per_s``."""
        view = self._view
        row = None if view is None else view.index_of.get(instance_id)
        if self._router is not None and view is not None and row is not None:
            return float(self._router.predict_rows(request, view, now_s).own_s[row])
        return request.input_tokens / self.prefill_tokens_per_s

    def withdrawn(self, key: tuple[str, int]) -> None:
        """A held request left its pool without an answer (its client gave up)."""
        self._held.discard(key)
