"""The routing service: admission (pass-through until SLOMax) and instance choice per model pool.

Knows nothing of Kafka: it takes decoded requests and the pool's instance-state entries and
returns decision events. One policy object per model pool, so a pool's routing state (its own
in-flight accounting, prefix index) lives with the worker that owns the pool's partition.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents.policy import make_policy
from agents.policy.types import Policy
from schemas.events import AdmissionDecision, Completion, InferenceRequest, KvEvent, RoutingDecision
from streams.snapshot import cluster_view, policy_completion, policy_kv_event, request_view

InstanceStates = Mapping[str, Mapping[str, Any]]
"""instance id -> its last Heartbeat (as a dict), for one model pool."""


@dataclass(frozen=True, slots=True)
class Routed:
    """The outcome for one request: its admission decision and, if it runs now, where."""

    request: InferenceRequest
    admission: AdmissionDecision
    routing: RoutingDecision | None


class Router:
    def __init__(self, policy_name: str, seed: int = 0, worker: str = "") -> None:
        make_policy(policy_name, seed)  # fail fast on an unknown name
        self.policy_name = policy_name
        self.worker = worker
        self.seed = seed
        self._policies: dict[str, Policy] = {}
        self._held: dict[str, list[InferenceRequest]] = {}

    def policy_for(self, pool: str) -> Policy:
        policy = self._policies.get(pool)
        if policy is None:
            policy = self._policies[pool] = make_policy(self.policy_name, self.seed)
        return policy

    def route(self, requests: Sequence[InferenceRequest], states: InstanceStates, now: float) -> list[Routed]:
        """Decide for a batch of one pool's requests on the snapshot ``states`` at ``now``.

        Requests held earlier (no instance had reported yet, or the policy said "queue") are
        offered again first. A held request gets a "queue" admission decision once, when first
        held; it gets its routing decision when it is routed.
        """
        if not requests:
            return []
        pool = requests[0].model
        held = self._held.pop(pool, [])
        batch = [*held, *requests]
        first_time = {id(r) for r in requests}
        if not states:
            self._held[pool] = batch
            reason = "no instance of this model has reported yet"
            return [self._queued(r, reason) for r in requests]
        view = cluster_view(states)
        views = [request_view(r) for r in batch]
        started = time.perf_counter()
        decisions = self.policy_for(pool).decide(views, view, now)
        latency = (time.perf_counter() - started) / len(batch)
        out = []
        for request, seen, decision in zip(batch, views, decisions, strict=True):
            if decision.action == "queue":
                self._held.setdefault(pool, []).append(request)
                if id(request) in first_time:
                    out.append(self._queued(request, decision.reason))
                continue
            common = _common(request, seen.slo_class)
            if decision.action == "reject":
                admission = AdmissionDecision(
                    **common, action="reject", reason=decision.reason, policy=self.policy_name
                )
                out.append(Routed(request, admission, None))
                continue
            admission = AdmissionDecision(
                **common, action="admit", reason="pass-through", policy=self.policy_name
            )
            routing = RoutingDecision(
                **common,
                dc=str(view.dc[decision.instance]),
                instance_id=view.instance_ids[decision.instance],
                policy=self.policy_name,
                reason=decision.reason,
                predicted_ttft_s=decision.predicted_ttft_s,
                decision_latency_s=latency,
                worker=self.worker,
                request=request,
            )
            out.append(Routed(request, admission, routing))
        return out

    def held(self) -> int:
        return sum(len(v) for v in self._held.values())

    def _queued(self, request: InferenceRequest, reason: str) -> Routed:
        common = _common(request, request_view(request).slo_class)
        admission = AdmissionDecision(**common, action="queue", reason=reason, policy=self.policy_name)
        return Routed(request, admission, None)

    def observe_completion(self, event: Completion) -> None:
        self.policy_for(event.model).observe(policy_completion(event))

    def observe_kv(self, event: KvEvent) -> None:
        policy = self.policy_for(event.model)
        if policy.wants_kv_events:
            policy.observe(policy_kv_event(event))


def _common(request: InferenceRequest, slo_class: str) -> dict[str, Any]:
    return {
        "request_id": request.request_id,
        "attempt": request.attempt,
        "tenant": request.tenant,
        "model": request.model,
        "slo_class": slo_class,
    }
