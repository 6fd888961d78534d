"""A simulated run stored as the stack stores a real one: each attempt of a ``RunResult`` turned
into the wire events a worker and a dispatcher publish (``InferenceRequest``,
``AdmissionDecision``, ``RoutingDecision``, ``Completion``; a ``Heartbeat`` every ``BEAT_S`` per
instance), written through the feedback sink with a ``run_id`` and ``run_policy``, ``BATCH``
events a write. Simulated seconds are placed on the wall clock from ``origin`` (recent: the
store keeps heartbeats 7 days). For the benchmarks and the tests that read a run back
(``bench.replay_speed``, the replay's and the store summary's integration tests)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from clickhouse_connect.driver.client import Client

from agents.policy.common.slo import DEFAULT_SLO_CLASSES
from agents.policy.types import BLOCK_TOKENS
from infra.clickhouse import FeedbackSink
from schemas.events import AdmissionDecision, Completion, Heartbeat, InferenceRequest, RoutingDecision
from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec
from sim.loop.lifecycle import Measures, deadline_at
from sim.loop.results import RunResult

BEAT_S = 1.0
"""Heartbeat interval of the stored run (seconds)."""
BATCH = 20_000
"""Events per sink write (each write first asks the store which of them it holds)."""


def store_run(client: Client, result: RunResult, fleet: FleetSpec, run_id: str, origin: float) -> int:
    """Write ``result`` (simulated on ``fleet``) as run ``run_id`` of policy ``result.policy``;
    returns the requests written (distinct request ids)."""
    sink = FeedbackSink(
        client,
        DEFAULT_SLO_CLASSES,
        retry_for_s=5.0,
        run_id=run_id,
        run_policy=result.policy,
        heartbeat_interval_s=BEAT_S,
    )
    attempts = result.attempts
    requests = [request_event(a, fleet.default_model, origin) for a in attempts]
    pairs = list(zip(attempts, requests, strict=True))
    placed = [(a, r) for a, r in pairs if a.instance is not None]
    _write(sink.write_requests, requests)
    _write(sink.write_admission, [admission_event(a, r, result.policy) for a, r in pairs])
    _write(sink.write_routing, [routing_event(a, r, result.policy) for a, r in placed])
    _write(sink.write_completions, [completion_event(a, r) for a, r in placed if a.end_s is not None])
    end_s = max((a.end_s for a, _ in placed if a.end_s is not None), default=0.0)
    _write(sink.write_heartbeats, heartbeats([a for a, _ in placed], fleet, origin, end_s))
    return len({a.request.request_id for a in attempts})


def _write(write: Callable[[Sequence[Any]], Any], events: Sequence[Any]) -> None:
    for lo in range(0, len(events), BATCH):
        write(events[lo : lo + BATCH])


def request_event(attempt: Attempt, model: str, origin: float) -> InferenceRequest:
    """The request as a gateway publishes it: its prompt's block-hash chain, no text; ``model``
    where the simulated request names none."""
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


def admission_event(attempt: Attempt, request: InferenceRequest, policy: str) -> AdmissionDecision:
    """``admit`` for an attempt that reached an instance, else ``reject``; decided on arrival."""
    return AdmissionDecision(
        ts=request.ts,
        request_id=request.request_id,
        attempt=request.attempt,
        tenant=request.tenant,
        model=request.model,
        slo_class=attempt.request.slo_class,
        action="admit" if attempt.instance is not None else "reject",
        policy=policy,
        input_tokens=request.input_tokens,
    )


def routing_event(attempt: Attempt, request: InferenceRequest, policy: str) -> RoutingDecision:
    """The decision that sent ``attempt`` to its instance, when it was sent."""
    assert attempt.instance is not None
    spec = attempt.instance.spec
    sent = attempt.sent_s if attempt.sent_s is not None else attempt.arrival_s
    return RoutingDecision(
        ts=request.ts + (sent - attempt.arrival_s),
        request_id=request.request_id,
        attempt=request.attempt,
        tenant=request.tenant,
        model=request.model,
        slo_class=attempt.request.slo_class,
        dc=spec.dc,
        instance_id=spec.instance_id,
        policy=policy,
        decision_latency_s=0.0,
        request=request,
    )


def completion_event(attempt: Attempt, request: InferenceRequest) -> Completion:
    """How ``attempt`` ended, measured as the dispatcher measures it (``Measures``)."""
    assert attempt.instance is not None and attempt.end_s is not None
    measures = Measures.of(attempt)
    return Completion(
        ts=request.ts + (attempt.end_s - attempt.arrival_s),
        request_id=request.request_id,
        attempt=request.attempt,
        instance_id=attempt.instance.spec.instance_id,
        model=request.model,
        tenant=request.tenant,
        slo_class=attempt.request.slo_class,
        status=measures.status,
        arrival_ts=request.ts,
        ttft_s=measures.ttft_s,
        tpot_s=measures.tpot_s,
        e2e_s=measures.e2e_s,
        input_tokens=request.input_tokens,
        cached_tokens=attempt.cached_tokens,
        output_tokens=attempt.generated,
        deadline_ts=request.deadline_ts,
    )


def heartbeats(placed: Sequence[Attempt], fleet: FleetSpec, origin: float, end_s: float) -> list[Heartbeat]:
    """A beat every ``BEAT_S`` per instance from 0 to ``end_s``: the attempts it was running
    (scheduled, not ended), those waiting (sent, not yet scheduled), and the tokens they hold
    (``_held``): ``tokens_in_flight`` over both, ``kv_blocks_used`` (512-token blocks, rounded
    up) over those running."""
    times = np.arange(math.ceil(end_s / BEAT_S) + 1) * BEAT_S
    by_instance: dict[str, list[Attempt]] = {spec.instance_id: [] for spec in fleet.instances}
    for attempt in placed:
        assert attempt.instance is not None
        by_instance[attempt.instance.spec.instance_id].append(attempt)
    beats = []
    for spec in fleet.instances:
        mine = by_instance[spec.instance_id]
        total = spec.profile.kv_tokens // BLOCK_TOKENS
        running, in_kv = _held(times, mine, lambda a: a.admitted_s)
        queued, in_flight = _held(times, mine, lambda a: a.sent_s)
        for k, t in enumerate(times):
            beats.append(
                Heartbeat(
                    ts=origin + float(t),
                    instance_id=spec.instance_id,
                    dc=spec.dc,
                    model=spec.model,
                    model_version=spec.version,
                    profile=spec.profile.name,
                    waiting=int(queued[k] - running[k]),
                    running=int(running[k]),
                    tokens_in_flight=int(in_flight[k]),
                    kv_blocks_used=min(total, math.ceil(in_kv[k] / BLOCK_TOKENS)),
                    kv_blocks_total=total,
                    gpus=spec.profile.gpus,
                    price_per_hour=spec.price,
                    kv_block_tokens=spec.profile.kv_block_tokens,
                    max_seqs=spec.profile.max_seqs,
                    prefill_budget_tokens=spec.profile.prefill_budget_tokens,
                )
            )
    return beats


def _held(times: np.ndarray, attempts: Sequence[Attempt], since: Any) -> tuple[np.ndarray, np.ndarray]:
    """At each time of ``times``: how many ``attempts`` had begun (``since(a)``, None: never)
    and not ended, and the tokens they held: the prompt, and the output so far, made evenly
    from the first token to the end."""
    begun = np.array([np.nan if since(a) is None else since(a) for a in attempts], dtype=float)
    end = np.array([np.inf if a.end_s is None else a.end_s for a in attempts], dtype=float)
    first = np.array([np.nan if a.first_token_s is None else a.first_token_s for a in attempts], dtype=float)
    prompt = np.array([a.request.input_tokens for a in attempts], dtype=float)
    made = np.array([a.generated for a in attempts], dtype=float)
    count, tokens = np.zeros(len(times)), np.zeros(len(times))
    chunk = 256  # beats at a time, against the attempts alive in their span only
    for lo in range(0, len(times), chunk):
        t = times[lo : lo + chunk]
        alive = (begun <= t[-1]) & (end > t[0])
        b, e, f = begun[alive], end[alive], first[alive]
        inside = (b <= t[:, None]) & (t[:, None] < e)
        progress = np.clip((t[:, None] - f) / np.maximum(e - f, 1e-9), 0.0, 1.0)
        held = prompt[alive] + made[alive] * np.nan_to_num(progress)
        count[lo : lo + chunk] = inside.sum(axis=1)
        tokens[lo : lo + chunk] = np.where(inside, held, 0.0).sum(axis=1)
    return count, tokens
