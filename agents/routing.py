"""The routing service: wire events in, the ``Scheduler`` decides, decision events out.

Knows nothing of Kafka or Faust. One ``Scheduler`` per model pool, so a pool's scheduling state
(queue pools, in-flight accounting, prefix index, predictor) lives with the worker that owns
the pool's partition. It drives the scheduler exactly as the simulator does: ``route`` offers
new requests, ``tick`` offers held ones again on a new snapshot (called on every heartbeat that
changes the pool's view), ``observe_*`` forwards what a proxying router sees.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.convert import blocks_changed, finished, first_token, request_view
from agents.policy import Scheduler, build_scheduler
from agents.policy.registry import StageParams
from agents.policy.types import ClusterView, Outcome, empty_view
from schemas.events import (
    AdmissionDecision,
    Completion,
    InferenceRequest,
    KvEvent,
    ResponseStarted,
    RoutingDecision,
)


@dataclass(frozen=True, slots=True)
class Routed:
    """The outcome for one request: its admission decision and, if it runs now, where."""

    request: InferenceRequest
    admission: AdmissionDecision
    routing: RoutingDecision | None


@dataclass(slots=True)
class _Pool:
    scheduler: Scheduler
    requests: dict[tuple[str, int], InferenceRequest] = field(default_factory=dict)  # offered, unsettled


class RoutingService:
    def __init__(
        self, policy: str, seed: int = 0, params: StageParams | None = None, worker: str = ""
    ) -> None:
        build_scheduler(policy, seed, params)  # fail fast on an unknown name or parameter
        self.policy_name = policy
        self.seed = seed
        self.params = params
        self.worker = worker
        self._pools: dict[str, _Pool] = {}

    def scheduler_for(self, pool: str) -> Scheduler:
        return self._pool(pool).scheduler

    def route(
        self, pool: str, requests: Sequence[InferenceRequest], view: ClusterView | None, now: float
    ) -> list[Routed]:
        """New requests of ``pool`` on its snapshot ``view`` (None: no instance reported yet).

        A request whose (id, attempt) is already held here, or comes twice in one batch, is a
        redelivery: it is skipped, so a held request is decided once."""
        state = self._pool(pool)
        views = []
        for request in requests:
            seen = request_view(request)
            if seen.key in state.requests:
                continue
            state.requests[seen.key] = request
            views.append(seen)
        started = time.perf_counter()
        outcomes = state.scheduler.submit(views, view if view is not None else empty_view(), now)
        return self._events(state, outcomes, (time.perf_counter() - started) / max(len(views), 1))

    def tick(self, pool: str, view: ClusterView, now: float) -> list[Routed]:
        """Offer ``pool``'s held requests again on ``view`` (nothing if none is held or the view
        is one they were already offered on)."""
        state = self._pools.get(pool)
        if state is None or not state.scheduler.held_total:
            return []
        started = time.perf_counter()
        outcomes = state.scheduler.tick(view, now)
        return self._events(state, outcomes, (time.perf_counter() - started) / max(len(outcomes), 1))

    def held(self, pool: str) -> int:
        state = self._pools.get(pool)
        return 0 if state is None else state.scheduler.held_total

    def observe_completion(self, event: Completion) -> None:
        self._pool(event.model).scheduler.observe(finished(event))

    def observe_first_token(self, event: ResponseStarted) -> None:
        self._pool(event.model).scheduler.observe(first_token(event))

    def observe_kv(self, event: KvEvent) -> None:
        scheduler = self._pool(event.model).scheduler
        if scheduler.wants_kv_events:
            scheduler.observe(blocks_changed(event))

    # --- helpers ------------------------------------------------------------------------------

    def _pool(self, pool: str) -> _Pool:
        state = self._pools.get(pool)
        if state is None:
            state = self._pools[pool] = _Pool(build_scheduler(self.policy_name, self.seed, self.params))
        return state

    def _events(self, state: _Pool, outcomes: list[Outcome], latency_s: float) -> list[Routed]:
        routed = []
        for outcome in outcomes:
            key = outcome.request.key
            request = state.requests[key] if outcome.action == "queue" else state.requests.pop(key)
            common = self._common(request, outcome)
            if outcome.action == "queue":
                admission = AdmissionDecision(
                    **common, action="queue", reason=outcome.reason, queue_pool=outcome.pool
                )
                routed.append(Routed(request, admission, None))
                continue
            admission = AdmissionDecision(
                **common,
                action=outcome.action,
                reason=outcome.admission_reason,
                predicted_ttft_s=outcome.predicted_ttft_s if outcome.action == "reject" else None,
            )
            if outcome.action == "reject":
                routed.append(Routed(request, admission, None))
                continue
            routing = RoutingDecision(
                **common,
                dc=outcome.dc,
                instance_id=outcome.instance_id,
                reason=outcome.reason,
                predicted_ttft_s=outcome.predicted_ttft_s,
                decision_latency_s=latency_s,
                worker=self.worker,
                request=request,
            )
            routed.append(Routed(request, admission, routing))
        return routed

    def _common(self, request: InferenceRequest, outcome: Outcome) -> dict[str, Any]:
        return {
            "request_id": request.request_id,
            "attempt": request.attempt,
            "tenant": request.tenant,
            "model": request.model,
            "slo_class": outcome.request.slo_class,
            "policy": self.policy_name,
        }
