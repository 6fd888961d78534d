"""The vLLM engine port running a decision that names a prefill instance
(``dispatcher/engines/vllm/adapter.py``): a prefill step that succeeded adds exactly one event
before the whole call's, the end of the prefill leg on the prefill instance; one that fell back
to local prefill adds none. The servers are loopback fakes of vLLM's OpenAI API."""

from __future__ import annotations

import asyncio
import time

from aiohttp.test_utils import TestServer

from dispatcher.engines.port import EngineEvent
from dispatcher.engines.vllm.adapter import VllmEngines
from infra.vllm.inventory import parse_inventory
from schemas.events import Completion, InferenceRequest, Response, ResponseStarted, RoutingDecision
from tests.unit.gateway.test_prefill_leg import PairEngine

MODEL = "m"


def decision(prefill_instance_id: str) -> RoutingDecision:
    request = InferenceRequest(
        request_id="r", model=MODEL, input_tokens=8, output_budget=3, prompt="hello there"
    )
    return RoutingDecision(
        request_id="r", model=MODEL, slo_class="interactive", dc="local", instance_id="d",
        prefill_instance_id=prefill_instance_id, policy="fake", decision_latency_s=0.0, request=request,
    )  # fmt: skip


def events_of(routing: RoutingDecision, prefill: PairEngine, decode: PairEngine) -> list[EngineEvent]:
    async def main() -> list[EngineEvent]:
        async with TestServer(prefill.app()) as p, TestServer(decode.app()) as d:
            instances = [
                {"id": "p", "url": str(p.make_url("")).rstrip("/"), "model": MODEL},
                {"id": "d", "url": str(d.make_url("")).rstrip("/"), "model": MODEL},
            ]
            engines = VllmEngines(parse_inventory({"instances": instances}), kv_events=False)
            try:
                assert await engines.dispatch(routing, time.time())
                deadline = time.monotonic() + 5
                while engines.open_requests and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                return await engines.events(time.time())
            finally:
                await engines.close()

    return asyncio.run(main())


def test_a_pair_reports_the_end_of_its_prefill_leg_once_before_the_calls_events() -> None:
    prefill, decode = PairEngine(), PairEngine()
    events = events_of(decision("p"), prefill, decode)
    assert prefill.prefills == 1 and decode.bodies[-1]["kv_transfer_params"] == {"remote_engine_id": "p"}
    assert [type(e) for e in events] == [ResponseStarted, ResponseStarted, Response, Completion]
    leg, first = events[0], events[1]
    assert isinstance(leg, ResponseStarted) and isinstance(first, ResponseStarted)
    assert [(e.instance_id, e.prefill_leg) for e in (leg, first)] == [("p", True), ("d", False)]
    assert 0 <= leg.ttft_s <= first.ttft_s and leg.ts <= first.ts
    assert {e.instance_id for e in events[1:]} == {"d"}


def test_a_prefill_that_fell_back_or_was_never_tried_reports_no_prefill_leg() -> None:
    for prefill_status, prefill_instance in ((503, "p"), (200, "p9"), (200, "")):
        prefill, decode = PairEngine(prefill_status=prefill_status), PairEngine()
        events = events_of(decision(prefill_instance), prefill, decode)
        assert [type(e) for e in events] == [ResponseStarted, Response, Completion], prefill_instance
        assert not any(isinstance(e, ResponseStarted) and e.prefill_leg for e in events)
        assert prefill.prefills == (1 if prefill_status == 503 else 0)
