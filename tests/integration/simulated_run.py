"""A simulated run stored as the stack stores a real one: each attempt of a ``RunResult`` turned
into the wire events a worker and a dispatcher publish (``InferenceRequest``, ``RoutingDecision``,
``Completion``; ``Heartbeat`` once a second per instance), written through the feedback sink
with a ``run_id`` and ``run_policy``. Simulated seconds are placed on the wall clock from
``origin`` (recent: the store keeps heartbeats 7 days)."""

from __future__ import annotations

import math

from clickhouse_connect.driver.client import Client

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from agents.policy.types import BLOCK_TOKENS
from infra.clickhouse import FeedbackSink
from schemas.events import Completion, Heartbeat, InferenceRequest, RoutingDecision
from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec
from sim.loop.lifecycle import Measures, deadline_at
from sim.loop.results import RunResult

BEAT_S = 1.0
"""Heartbeat interval of the stored run (seconds)."""


def store_run(client: Client, result: RunResult, fleet: FleetSpec, run_id: str, origin: float) -> int:
    """Write ``result`` (simulated on ``fleet``) as run ``run_id`` of policy ``result.policy``;
    returns the attempts written."""
    sink = FeedbackSink(
        client,
        DEFAULT_SLO_CLASSES,
        retry_for_s=5.0,
        run_id=run_id,
        run_policy=result.policy,
        heartbeat_interval_s=BEAT_S,
    )
    model = fleet.default_model
    requests = {id(a): request_event(a, model, origin) for a in result.attempts}
    placed = [a for a in result.attempts if a.instance is not None]
    sink.write_requests(list(requests.values()))
    sink.write_routing([routing_event(a, requests[id(a)], result.policy, origin) for a in placed])
    sink.write_completions([completion_event(a, model, origin) for a in placed if a.end_s is not None])
    end = max((a.end_s for a in placed if a.end_s is not None), default=0.0)
    sink.write_heartbeats(heartbeats(placed, fleet, origin, end))
    return len(result.attempts)


def request_event(attempt: Attempt, model: str, origin: float) -> InferenceRequest:
    request = attempt.request
    deadline = deadline_at(request)
    return InferenceRequest(
        ts=origin + attempt.arrival_s,
        request_id=request.request_id,
        attempt=attempt.attempt,
        tenant=request.tenant,
        model=request.model or model,
        task_type=request.task_type,
        input_tokens=request.input_tokens,
        output_budget=attempt.output_budget,
        slo_class=request.slo_class,
        deadline_ts=None if deadline is None else origin + deadline,
        prompt_block_hashes=request.block_hashes[: request.input_tokens // BLOCK_TOKENS],
    )


def routing_event(attempt: Attempt, request: InferenceRequest, policy: str, origin: float) -> RoutingDecision:
    assert attempt.instance is not None
    spec = attempt.instance.spec
    return RoutingDecision(
        ts=origin + (attempt.sent_s if attempt.sent_s is not None else attempt.arrival_s),
        request_id=request.request_id,
        attempt=attempt.attempt,
        tenant=request.tenant,
        model=request.model,
        slo_class=attempt.request.slo_class,
        dc=spec.dc,
        instance_id=spec.instance_id,
        policy=policy,
        decision_latency_s=0.0,
        request=request,
    )


def completion_event(attempt: Attempt, model: str, origin: float) -> Completion:
    assert attempt.instance is not None and attempt.end_s is not None
    measures = Measures.of(attempt)
    deadline = deadline_at(attempt.request)
    return Completion(
        ts=origin + attempt.end_s,
        request_id=attempt.request.request_id,
        attempt=attempt.attempt,
        instance_id=attempt.instance.spec.instance_id,
        model=attempt.request.model or model,
        tenant=attempt.request.tenant,
        slo_class=attempt.request.slo_class,
        status=measures.status,
        arrival_ts=origin + attempt.arrival_s,
        ttft_s=measures.ttft_s,
        tpot_s=measures.tpot_s,
        e2e_s=measures.e2e_s,
        input_tokens=attempt.request.input_tokens,
        cached_tokens=attempt.cached_tokens,
        output_tokens=attempt.generated,
        deadline_ts=None if deadline is None else origin + deadline,
    )


def heartbeats(placed: list[Attempt], fleet: FleetSpec, origin: float, end_s: float) -> list[Heartbeat]:
    """A beat every ``BEAT_S`` per instance over the run: the attempts it was running (scheduled,
    not ended) and those waiting (sent, not yet scheduled) at that instant."""
    beats = []
    for spec in fleet.instances:
        mine = [
            a for a in placed if a.instance is not None and a.instance.spec.instance_id == spec.instance_id
        ]
        for k in range(math.ceil(end_s / BEAT_S) + 1):
            t = k * BEAT_S
            running = sum(1 for a in mine if _during(a.admitted_s, a.end_s, t))
            waiting = sum(1 for a in mine if _during(a.sent_s, a.admitted_s or a.end_s, t))
            beats.append(
                Heartbeat(
                    ts=origin + t,
                    instance_id=spec.instance_id,
                    dc=spec.dc,
                    model=spec.model,
                    model_version=spec.version,
                    profile=spec.profile.name,
                    waiting=waiting,
                    running=running,
                    tokens_in_flight=0,
                    kv_blocks_used=0,
                    kv_blocks_total=spec.profile.kv_tokens // BLOCK_TOKENS,
                    gpus=spec.profile.gpus,
                    price_per_hour=spec.price,
                )
            )
    return beats


def _during(start: float | None, end: float | None, t: float) -> bool:
    return start is not None and start <= t and (end is None or t < end)
