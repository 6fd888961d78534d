"""``gateway_vllm_engine_kill``: one of two real vLLM CPU servers (the tiny model, ``tokenfleet up
--engines local``) killed (kill -9 of its process group: the API server and its engine core)
while calls go through the gateway; the gateway re-places what it held, ``up``'s supervisor
restarts it."""

from __future__ import annotations

import asyncio

from lab.faults.gateway_harness import GatewayRun, GatewayScenario

ENGINE = "vllm-0"


async def _body(run: GatewayRun) -> None:
    """300 calls over 150 s (8-24 tokens: vLLM on two shared cores); at 40 s ``vllm-0`` is
    killed. ``fault_end``: the supervisor restarted it and it answers ``/health`` (30-90 s on
    CPU), or the traffic's end if later. The engines count no request ids: ``engine_starts`` is
    vLLM's ``vllm:request_success_total`` (every finish reason, aborts included) over both
    servers and their processes. Target: 0 failed calls."""
    traffic = asyncio.create_task(run.traffic_for(150.0, tag="v", max_tokens=(8, 24)))
    try:
        await asyncio.sleep(40.0)
        restarts = run.part(ENGINE).restarts
        run.fault_start = run.kill(ENGINE, group=True)
        run.fault_end = await run.back(ENGINE, restarts, timeout_s=300.0)
    finally:
        await traffic


gateway_vllm_engine_kill = GatewayScenario(_body, engines="local")
