"""Small builders shared by the simulator tests."""

from __future__ import annotations

import zlib
from dataclasses import replace

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
