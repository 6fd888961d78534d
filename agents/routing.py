"""The routing service: wire events in, the ``Scheduler`` decides, decision events out.

Knows nothing of Kafka or Faust. One ``Scheduler`` per model pool, so a pool's scheduling state
(queue pools, in-flight accounting, prefix index, predictor) lives with the worker that owns
the pool's partition. It drives the scheduler exactly as the simulator does: ``route`` offers
new requests, ``tick`` offers held ones again on a new snapshot (called on every heartbeat that
changes the pool's view), ``expire`` rejects what was held too long (called on a timer, so a
pool nobody serves still answers), ``observe_*`` forwards what a proxying router sees, and
``notices`` drains what the schedulers have to tell operators (``tf.fleet-events``).

Once per request attempt: a request already held is a redelivery (the bus delivers at least
once, and the request lane re-reads a batch it could not finish) and is skipped; one already
decided in the last ``remembered`` decisions of its pool (here, or by another decider whose
placement this one read) is a redelivery or a client's resend for want of an answer (a broker
may lose what it acknowledged): it gets the decision it had, published again with the same
event id (``answers_again``), never a second one. A decision is kept without its request (the
prompt can be large): the offer carries the request again. With ``known_pools`` set, a
request for any other model is rejected at once (reason ``unknown_model``), never held;
without it, any model name gets a scheduler (each holds real state: a prefix index, a
predictor), but names no engine has served (no heartbeat, no engine event) take at most
``max_pools`` places: when they are full, the oldest such name that holds nothing is forgotten
to make room, and only when none can be is a request rejected the same way. A pool an engine
serves always gets its place, so junk names can never lock a real pool out.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.convert import (
    blocks_changed,
    finished,
    first_token,
    fleet_event,
    held_elsewhere,
    placed,
    request_view,
)
from agents.policy import Scheduler, build_scheduler
from agents.policy.pools import HoldLimits
from agents.policy.registry import StageParams
from agents.policy.types import ClusterView, Outcome, empty_view
from schemas.events import (
    AdmissionDecision,
    Completion,
    FleetEvent,
    InferenceRequest,
    KvEvent,
    ResponseStarted,
    RoutingDecision,
)

LANE_MEMORY_S = 30.0  # a decider whose placements were not read for this long is gone


@dataclass(frozen=True, slots=True)
class Routed:
    """The outcome for one request: its admission decision and, if it runs now, where."""

    request: InferenceRequest
    admission: AdmissionDecision
    routing: RoutingDecision | None


@dataclass(frozen=True, slots=True)
class Answer:
    """A decision made before, to publish again: its admission answer (None: another decider's
    placement, whose admission this one did not read) and its placement (None: a reject).
    Kept with ``request=None`` in the routing (``keep``); ``to`` puts the offered request back."""

    admission: AdmissionDecision | None
    routing: RoutingDecision | None

    @classmethod
    def keep(cls, admission: AdmissionDecision | None, routing: RoutingDecision | None) -> Answer:
        return cls(admission, None if routing is None else routing.model_copy(update={"request": None}))

    def to(self, request: InferenceRequest) -> Answer:
        routing = None if self.routing is None else self.routing.model_copy(update={"request": request})
        return Answer(self.admission, routing)


@dataclass(slots=True)
class _Pool:
    scheduler: Scheduler
    requests: dict[tuple[str, int], InferenceRequest] = field(default_factory=dict)  # offered, unsettled
    decided: dict[tuple[str, int], Answer | None] = field(default_factory=dict)  # settled, oldest first
    deciders: dict[str, float] = field(default_factory=dict)  # other deciders seen -> when, last
    served: bool = False  # an engine of this pool has reported (a heartbeat, an engine event)


class RoutingService:
    def __init__(
        self,
        policy: str,
        seed: int = 0,
        params: StageParams | None = None,
        worker: str = "",
        hold: HoldLimits | None = None,
        known_pools: Collection[str] = (),
        remembered: int = 100_000,
        make_scheduler: Callable[[str], Scheduler] | None = None,
        max_pools: int = 1024,
        scheduler: str = "",
        log_delay_s: float = 0.0,
    ) -> None:
        """``make_scheduler`` builds each pool's scheduler (default: ``policy`` from the registry,
        with ``params`` and ``hold``); tests inject their own stages through it. ``scheduler``:
        the name every decision carries (the deciders' consumer group), so another scheduler on
        the same topics can tell it is not alone. ``log_delay_s``: how late this decider reads the
        other deciders' decisions from the log (``Scheduler.decide_in_lane``; 0 defers nothing)."""
        probe = build_scheduler(policy, seed, params)  # fail fast on an unknown name or parameter
        self.wants_holds = probe.wants_holds  # whether the other deciders' holds matter here
        self.make_scheduler = make_scheduler or (lambda _pool: build_scheduler(policy, seed, params, hold))
        self.policy_name = policy
        self.worker = worker
        self.known_pools = frozenset(known_pools)
        self.remembered = remembered
        self.max_pools = max_pools
        self.scheduler = scheduler
        self.log_delay_s = log_delay_s
        self._pools: dict[str, _Pool] = {}

    def scheduler_for(self, pool: str) -> Scheduler:
        return self._pool(pool).scheduler

    def route(
        self, pool: str, requests: Sequence[InferenceRequest], view: ClusterView | None, now: float
    ) -> list[Routed]:
        """New requests of ``pool`` on its snapshot ``view`` (None: no instance reported yet).

        A request whose (id, attempt) is already held here, or comes twice in one batch, is a
        redelivery: it is skipped, so a held request is decided once; so is one already decided
        (``answers_again`` gives its decision)."""
        if not self._serves(pool, served=view is not None and len(view.instance_ids) > 0):
            return [self._unknown(request) for request in requests]
        state = self._pool(pool)
        self._find_lane(state, now)
        views = []
        for request in requests:
            seen = request_view(request)
            if seen.key in state.requests or seen.key in state.decided:
                continue
            state.requests[seen.key] = request
            views.append(seen)
        started = time.perf_counter()
        try:
            outcomes = state.scheduler.submit(views, view if view is not None else empty_view(), now)
        except Exception:
            for seen in views:  # not decided: a caller may offer them again, one by one
                if not state.scheduler.holds(seen.key):
                    state.requests.pop(seen.key, None)
            raise
        return self._events(state, outcomes, (time.perf_counter() - started) / max(len(views), 1))

    def answers_again(self, pool: str, requests: Sequence[InferenceRequest]) -> list[Answer]:
        """The decisions made before for those of ``requests`` already decided (here, or by
        another decider whose placement this one read), each with its request: to publish again
        with their own event ids (a redelivery, or a client's resend). ``route`` skips them."""
        state = self._pools.get(pool)
        if state is None:
            return []
        answers = (state.decided.get((r.request_id, r.attempt)) for r in requests)
        return [answer.to(r) for r, answer in zip(requests, answers, strict=True) if answer is not None]

    def answers(self) -> list[Answer]:
        """Every decision kept, oldest first per pool: for this worker's next process, when this
        one gives up after the broker lost its log (``restore``)."""
        return [answer for state in self._pools.values() for answer in state.decided.values() if answer]

    def restore(self, answers: Iterable[Answer]) -> int:
        """Decisions a previous process of this worker made: decided here too (a resend of
        one gets it again); how many were taken."""
        taken = 0
        for answer in answers:
            decision = answer.routing or answer.admission
            if decision is not None and self._serves(decision.model):
                self._decided(self._pool(decision.model), (decision.request_id, decision.attempt), answer)
                taken += 1
        return taken

    def tick(self, pool: str, view: ClusterView, now: float) -> list[Routed]:
        """Offer ``pool``'s held requests again on ``view`` (nothing if none is held or the view
        is one they were already offered on), and its deferred requests that are due."""
        state = self._pools.get(pool)
        if state is None or not state.scheduler.held_total:
            return []
        state.served = state.served or len(view.instance_ids) > 0
        started = time.perf_counter()
        outcomes = state.scheduler.tick(view, now)
        return self._events(state, outcomes, (time.perf_counter() - started) / max(len(outcomes), 1))

    def next_wake(self, pool: str) -> float | None:
        """When ``pool``'s earliest deferred request is due (``Scheduler.next_wake_s``): call
        ``tick`` then."""
        state = self._pools.get(pool)
        return None if state is None else state.scheduler.next_wake_s()

    def withdraw(self, pool: str, request_id: str, attempt: int) -> bool:
        """Stop holding a request (another worker takes it over); False if it was not held."""
        state = self._pools.get(pool)
        if state is None or not state.scheduler.withdraw(request_id, attempt):
            return False
        state.requests.pop((request_id, attempt), None)
        return True

    def remember_decided(self, admission: AdmissionDecision) -> None:
        """This admission answer went out before (e.g. from before a restart): its request attempt
        is decided; a reject is its answer (an admit's is its placement, read from the log)."""
        if self._serves(admission.model):
            answer = Answer.keep(admission, None) if admission.action == "reject" else None
            state = self._pool(admission.model)
            key = (admission.request_id, admission.attempt)
            if state.decided.get(key) is None:
                self._decided(state, key, answer)

    def expire(self, now: float) -> list[Routed]:
        """Reject, in every pool, the requests held longer than the hold timeout."""
        routed = []
        for state in self._pools.values():
            routed += self._events(state, state.scheduler.expire(now), 0.0)
        return routed

    def notices(self) -> list[FleetEvent]:
        """What the pools' schedulers have to tell operators since the last call (FleetMind's
        DC state changes, reservation moves, replica advice), oldest first per pool."""
        return [
            fleet_event(notice, self.worker)
            for state in self._pools.values()
            for notice in state.scheduler.notices()
        ]

    def refresh(self, pool: str, view: ClusterView, now: float) -> None:
        """Let ``pool``'s stages look at the fleet without a request (their notices follow)."""
        state = self._pools.get(pool)
        if state is not None:
            state.scheduler.refresh(view, now)

    def pools(self) -> list[str]:
        return list(self._pools)

    def held(self, pool: str) -> int:
        state = self._pools.get(pool)
        return 0 if state is None else state.scheduler.held_total

    def observe_completion(self, event: Completion) -> None:
        if self._serves(event.model, served=True):
            self._pool(event.model).scheduler.observe(finished(event))

    def observe_first_token(self, event: ResponseStarted) -> None:
        """A first token, or the end of a prefill leg (``prefill_leg``: ``PrefillDone``, as the
        simulator reports it), to the pool's scheduler."""
        if self._serves(event.model, served=True):
            self._pool(event.model).scheduler.observe(first_token(event))

    def observe_placement(self, decision: RoutingDecision) -> bool:
        """Another decider of the pool placed a request (read from ``tf.decisions``; this
        worker's own are skipped): its scheduler accounts for it as for its own placements
        (``Placed``), and the request attempt counts as decided here too, so a redelivery of it
        is never decided a second time. Whether it was applied."""
        if decision.worker == self.worker or not self._serves(decision.model, served=True):
            return False
        state = self._pool(decision.model)
        key = (decision.request_id, decision.attempt)
        if state.decided.get(key) is not None:
            return False  # seen before (the log is read at least once)
        if key in state.requests:  # held here too (a partition changed hands): let it go
            self.withdraw(decision.model, *key)
        known = key in state.decided  # (from its admission, read back after a restart)
        self._decided(state, key, Answer.keep(None, decision))
        state.deciders[decision.worker] = decision.ts
        if known:
            return False
        state.scheduler.observe(placed(decision))
        return True

    def observe_hold(self, decision: AdmissionDecision) -> bool:
        """Another decider of the pool newly held a request (a ``queue`` answer read from
        ``tf.admission``; one this worker holds or settled itself is skipped): its admission
        stage counts the pool's holds (``HeldElsewhere``). Whether it was passed on."""
        if decision.action != "queue" or not self._serves(decision.model, served=True):
            return False
        state = self._pool(decision.model)
        key = (decision.request_id, decision.attempt)
        if key in state.requests or key in state.decided:
            return False
        lane = None
        if decision.worker and decision.worker != self.worker:
            state.deciders[decision.worker] = decision.ts
            lane = self._deciders(state).index(decision.worker)
        state.scheduler.observe(held_elsewhere(decision, lane))
        return True

    def observe_kv(self, event: KvEvent) -> None:
        if self._serves(event.model, served=True):
            scheduler = self._pool(event.model).scheduler
            if scheduler.wants_kv_events:
                scheduler.observe(blocks_changed(event))

    # --- helpers ------------------------------------------------------------------------------

    def _pool(self, pool: str) -> _Pool:
        state = self._pools.get(pool)
        if state is None:
            state = self._pools[pool] = _Pool(self.make_scheduler(pool))
        return state

    def _serves(self, pool: str, served: bool = False) -> bool:
        """Whether ``pool`` has (or now gets) a scheduler here; ``served``: the caller saw an
        engine of it (see the module docstring)."""
        if self.known_pools:
            return pool in self.known_pools
        state = self._pools.get(pool)
        if state is None:
            if len(self._pools) >= self.max_pools and not self._forget_unserved() and not served:
                return False
            state = self._pools[pool] = _Pool(self.make_scheduler(pool))
        state.served = state.served or served
        return True

    def _forget_unserved(self) -> bool:
        """Free the place of the oldest pool no engine has served and that holds nothing;
        whether there was one."""
        for name, state in self._pools.items():
            if not state.served and not state.requests and not state.scheduler.held_total:
                del self._pools[name]
                return True
        return False

    def _unknown(self, request: InferenceRequest) -> Routed:
        known = ", ".join(sorted(self.known_pools)) or f"{self.max_pools} names no engine serves wait here"
        admission = AdmissionDecision(
            **self._common(request, request_view(request).slo_class),
            action="reject",
            reason=f"unknown_model: {request.model[:64]!r} is not served here (pools: {known})"[:1024],
            affinity_key=request.affinity_key,
        )
        return Routed(request, admission, None)

    def _find_lane(self, state: _Pool, now: float) -> None:
        """This worker's lane among the pool's deciders (``InstanceSelector.lane``): its rank
        among itself and the deciders whose placements or holds it read in the last
        ``LANE_MEMORY_S``."""
        if not state.deciders:
            return
        for worker, seen in list(state.deciders.items()):
            if now - seen > LANE_MEMORY_S:
                del state.deciders[worker]
        deciders = self._deciders(state)
        state.scheduler.decide_in_lane(deciders.index(self.worker), len(deciders), self.log_delay_s)

    def _deciders(self, state: _Pool) -> list[str]:
        """The pool's deciders in lane order: this worker and those seen (``_find_lane``)."""
        return sorted({self.worker, *state.deciders})

    def _decided(self, state: _Pool, key: tuple[str, int], answer: Answer | None) -> None:
        state.decided[key] = answer
        if len(state.decided) > self.remembered:
            del state.decided[next(iter(state.decided))]  # the oldest decision

    def _events(self, state: _Pool, outcomes: list[Outcome], latency_s: float) -> list[Routed]:
        routed = []
        for outcome in outcomes:
            key = outcome.request.key
            request = state.requests[key] if outcome.action == "queue" else state.requests.pop(key)
            common = self._common(request, outcome.request.slo_class)
            if outcome.action == "queue":  # (its size and decider: for the pool's other deciders)
                admission = AdmissionDecision(
                    **common,
                    action="queue",
                    reason=outcome.reason,
                    queue_pool=outcome.pool,
                    affinity_key=request.affinity_key,
                    worker=self.worker,
                    input_tokens=outcome.request.input_tokens,
                )
                routed.append(Routed(request, admission, None))
                continue
            admission = AdmissionDecision(
                **common,
                action=outcome.action,
                reason=outcome.admission_reason,
                predicted_ttft_s=outcome.predicted_ttft_s if outcome.action == "reject" else None,
                retry_after_s=outcome.retry_after_s,
                affinity_key=request.affinity_key,
            )
            if outcome.action == "reject":
                self._decided(state, key, Answer.keep(admission, None))
                routed.append(Routed(request, admission, None))
                continue
            routing = RoutingDecision(
                **common,
                dc=outcome.dc,
                instance_id=outcome.instance_id,
                prefill_instance_id=outcome.prefill_instance_id,
                reason=outcome.reason,
                predicted_ttft_s=outcome.predicted_ttft_s,
                decision_latency_s=latency_s,
                worker=self.worker,
                request=request,
            )
            self._decided(state, key, Answer.keep(admission, routing))
            routed.append(Routed(request, admission, routing))
        return routed

    def _common(self, request: InferenceRequest, slo_class: str) -> dict[str, Any]:
        return {
            "request_id": request.request_id,
            "attempt": request.attempt,
            "tenant": request.tenant,
            "model": request.model,
            "slo_class": slo_class,
            "policy": self.policy_name,
            "scheduler": self.scheduler,
        }
