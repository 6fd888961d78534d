"""Wire events <-> the policy core's views: the one place the two sides of the seam meet.

A stage never sees a wire event: only these views. The true output length is not on the wire
at all (the emulated fleet gets it from the workload): no policy can read it. The other way,
what the core has to tell operators (FleetMind's notices) becomes a wire event here.
"""

from __future__ import annotations

from agents.policy.common.slo import classify
from agents.policy.fleetmind.notices import FleetNotice
from agents.policy.types import (
    BlocksChanged,
    Finished,
    FirstToken,
    HeldElsewhere,
    OutcomeStatus,
    Placed,
    PrefillDone,
    RequestView,
)
from schemas.events import (
    MAX_REASON_LENGTH,
    AdmissionDecision,
    Completion,
    FleetEvent,
    InferenceRequest,
    KvEvent,
    ResponseStarted,
    RoutingDecision,
)


def request_view(request: InferenceRequest) -> RequestView:
    """What the scheduler may know of a request."""
    return RequestView(
        request_id=request.request_id,
        attempt=request.attempt,
        tenant=request.tenant,
        model=request.model,
        slo_class=classify(request.input_tokens, request.slo_class),
        input_tokens=request.input_tokens,
        output_budget=request.output_budget,
        block_hashes=request.prompt_block_hashes,
        arrival_s=request.ts,
        deadline_s=request.deadline_ts,
        task_type=request.task_type,
        allowed_regions=request.allowed_regions,
        home_dc=request.home_dc,
        model_version=request.model_version,
    )


def finished(event: Completion) -> Finished:
    status: OutcomeStatus = event.status
    return Finished(
        request_id=event.request_id,
        attempt=event.attempt,
        instance_id=event.instance_id,
        status=status,
        input_tokens=event.input_tokens,
        cached_tokens=event.cached_tokens,
        output_tokens=event.output_tokens,
        ttft_s=event.ttft_s,
        tpot_s=event.tpot_s,
        time_s=event.ts,
    )


def first_token(event: ResponseStarted) -> FirstToken | PrefillDone:
    """The client's first token (``FirstToken``), or with ``prefill_leg`` the end of a
    disaggregated request's prefill leg on its prefill instance (``PrefillDone``): the
    scheduler calibrates on the latter, not on the decode side's first token."""
    kind = PrefillDone if event.prefill_leg else FirstToken
    return kind(event.request_id, event.attempt, event.instance_id, event.ttft_s, event.ts)


def blocks_changed(event: KvEvent) -> BlocksChanged:
    return BlocksChanged(event.instance_id, event.kind, event.block_hashes, event.ts)


def placed(decision: RoutingDecision) -> Placed:
    """Another decider's placement, as the core observes it (when it was decided, not read)."""
    request = request_view(decision.request)
    return Placed(request, decision.instance_id, decision.ts, decision.predicted_ttft_s)


def held_elsewhere(decision: AdmissionDecision, lane: int | None) -> HeldElsewhere:
    """Another decider's new hold, as the core observes it (when it was decided, not read);
    ``lane``: its decider's lane among the pool's deciders."""
    return HeldElsewhere(
        decision.request_id,
        decision.attempt,
        decision.slo_class,
        decision.ts,
        input_tokens=decision.input_tokens,
        lane=lane,
    )


def fleet_event(notice: FleetNotice, worker: str = "") -> FleetEvent:
    """A FleetMind notice as the event operators read (``ts`` = the scheduler time it happened);
    a detail longer than a reason may be is cut, never refused."""
    detail = notice.detail
    if len(detail) > MAX_REASON_LENGTH:
        detail = detail[: MAX_REASON_LENGTH - 3] + "..."
    return FleetEvent(
        ts=notice.time_s,
        kind=notice.kind,
        dc=notice.dc,
        model=notice.model,
        model_version=notice.model_version,
        detail=detail,
        delta=notice.delta,
        tenant=notice.tenant,
        worker=worker,
        replicas=notice.replicas,
    )
