"""The events that report one attempt on a real engine, from what its stream showed.

Shared by the dispatcher's adapter (``adapter.py``) and the gateway (``gateway/proxy.py``),
so both measure alike: TTFT = first token - the request's ``ts`` (its arrival at TokenFleet);
TPOT = (last token - first token) / (output tokens - 1); E2E = end - ``ts``; durations clamped
into the schema's range (a producer's clock slightly ahead gives 0, not a rejected event).
"""

from __future__ import annotations

from typing import Literal

from agents.policy.common import timing
from infra.vllm.openai_http import Generation
from schemas.events import (
    MAX_DURATION_S,
    MAX_RESPONSE_CHARS,
    Completion,
    Response,
    ResponseStarted,
    RoutingDecision,
)

Status = Literal["ok", "timeout", "aborted", "error"]


def first_token(decision: RoutingDecision, now: float, prefill_leg: bool = False) -> ResponseStarted:
    """``decision``'s first token at ``now`` (wall seconds), ``ttft_s`` = ``now`` - the request's
    ``ts``; with ``prefill_leg`` the end of its prefill leg on its prefill instance instead."""
    return ResponseStarted(
        ts=now,
        request_id=decision.request_id,
        attempt=decision.attempt,
        instance_id=decision.prefill_instance_id if prefill_leg else decision.instance_id,
        model=decision.model,
        ttft_s=duration(now - decision.request.ts),
        prefill_leg=prefill_leg,
    )


def output_tokens(g: Generation) -> int:
    """The engine's usage count; the streamed steps when it sent no usage (an abort)."""
    return g.completion_tokens or g.chunks


def completion(decision: RoutingDecision, g: Generation, status: Status, now: float) -> Completion:
    request = decision.request
    output = output_tokens(g)
    observed_tpot = timing.tpot(g.first_token_ts, g.last_token_ts, output)
    observed_ttft = timing.ttft(g.first_token_ts, request.ts)
    return Completion(
        ts=now,
        request_id=decision.request_id,
        attempt=decision.attempt,
        instance_id=decision.instance_id,
        model=decision.model,
        tenant=decision.tenant,
        slo_class=decision.slo_class,
        status=status,
        arrival_ts=request.ts,
        ttft_s=None if observed_ttft is None else duration(observed_ttft),
        tpot_s=None if observed_tpot is None else duration(observed_tpot),
        e2e_s=duration(now - request.ts),
        input_tokens=g.prompt_tokens or request.input_tokens,
        cached_tokens=g.cached_tokens,
        output_tokens=output,
        deadline_ts=request.deadline_ts,
    )


def response(
    decision: RoutingDecision, g: Generation, status: Status, now: float, error: str = ""
) -> Response:
    return Response(
        ts=now,
        request_id=decision.request_id,
        attempt=decision.attempt,
        instance_id=decision.instance_id,
        model=decision.model,
        status=status,
        text=g.text[:MAX_RESPONSE_CHARS],
        finish_reason=g.finish_reason,
        prompt_tokens=g.prompt_tokens,
        completion_tokens=output_tokens(g),
        cached_tokens=g.cached_tokens,
        error=error[:1000],
    )


def duration(seconds: float) -> float:
    """A duration as the wire carries it (``timing.clamp_duration``)."""
    return timing.clamp_duration(seconds, MAX_DURATION_S)
