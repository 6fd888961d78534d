"""Small builders shared by the simulator tests."""

from __future__ import annotations

import zlib
from dataclasses import replace

from schemas.events import InferenceRequest, RoutingDecision
from sim.engine.fleet import FleetSpec, InstanceSpec
from sim.engine.profiles import PROFILES, EngineProfile
from sim.workloads.trace import TraceRequest, Workload, make_request

LLAMA = PROFILES["llama3-8b-h100"]


def fleet_of(n: int = 1, profile: EngineProfile = LLAMA) -> FleetSpec:
    return FleetSpec(
        f"{n}x{profile.name}",
        tuple(InstanceSpec(f"i{i}", "dc-1", "llama3-8b", "1", profile) for i in range(n)),
    )


def request(
    rid: str,
    at: float,
    input_tokens: int,
    output_tokens: int,
    blocks: list[int] | None = None,
    **kwargs: object,
) -> TraceRequest:
    return make_request(
        rid, at, input_tokens, output_tokens, blocks, unique_key=zlib.crc32(rid.encode()), **kwargs
    )  # type: ignore[arg-type]


def workload(*requests: TraceRequest) -> Workload:
    return Workload("test", tuple(sorted(requests, key=lambda r: r.arrival_s)))


def with_budget(profile: EngineProfile, tokens: int) -> EngineProfile:
    return replace(profile, prefill_budget_tokens=tokens)


def routing_decision(
    rid: str,
    input_tokens: int = 1000,
    output_tokens: int = 50,
    instance: str = "i0",
    slo_class: str = "interactive",
    at: float = 1_000.0,
    deadline_ts: float | None = None,
) -> RoutingDecision:
    """A routing decision carrying its request, as the worker sends it to the fleet."""
    request = InferenceRequest(
        ts=at,
        request_id=rid,
        model="llama3-8b",
        prompt_block_hashes=tuple(range(1, input_tokens // 512 + 1)),
        input_tokens=input_tokens,
        output_budget=output_tokens,  # the emulated engine generates the budget (no lengths given)
        slo_class=slo_class,
        deadline_ts=deadline_ts,
    )
    return RoutingDecision(
        ts=at,
        request_id=rid,
        model="llama3-8b",
        slo_class=slo_class,
        dc="dc-1",
        instance_id=instance,
        policy="test",
        decision_latency_s=0.0,
        request=request,
    )
