"""What the scheduler is shown of a simulated request and of the fleet's data centres."""

from __future__ import annotations

from agents.policy.types import DcView, RequestView
from sim.engine.attempt import Attempt
from sim.engine.fleet import FleetSpec
from sim.loop.lifecycle import deadline_at


def request_view(attempt: Attempt, default_model: str) -> RequestView:
    """The attempt as a router receives it (its budget, never its true output length); a
    request that names no model asks for ``default_model``."""
    request = attempt.request
    return RequestView(
        request_id=request.request_id,
        attempt=attempt.attempt,
        tenant=request.tenant,
        model=request.model or default_model,
        slo_class=request.slo_class,
        input_tokens=request.input_tokens,
        output_budget=attempt.output_budget,
        block_hashes=request.block_hashes,
        arrival_s=attempt.arrival_s,
        deadline_s=deadline_at(request),
        task_type=request.task_type,
        allowed_regions=request.allowed_regions,
        home_dc=request.home_dc,
        model_version=request.model_version,
    )


def dc_view(fleet: FleetSpec) -> DcView:
    """The fleet's data centres seen from its ingress."""
    names = fleet.dc_names
    ingress = fleet.ingress_dc
    links = tuple(fleet.kv_link_gbps.get(dc, 0.0) for dc in names)
    return DcView(names, tuple(fleet.rtt(ingress, dc) for dc in names), (True,) * len(names), links)
