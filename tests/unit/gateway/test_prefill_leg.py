"""A call the scheduler prefills on another instance (``RoutingDecision.prefill_instance_id``):
the gateway publishes the end of its prefill leg once, on the prefill instance and before the
client's first token, when the prefill step succeeded, and never when it fell back to local
prefill (``gateway/proxy.py``, ``infra/vllm/prefill_decode.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from infra.vllm.inventory import parse_inventory
from lab.gateway_alone import placed_on_e1
from schemas.events import InferenceRequest, ResponseStarted, RoutingDecision
from schemas.topics import FIRST_TOKENS
from tests.unit.gateway.fakes import MODEL, BusFreeGateway, CountingPrompts, FakeEngine, chat_body


@dataclass
class PairEngine(FakeEngine):
    """A ``FakeEngine`` that also answers vLLM's prefill step (a call not streamed): one token
    and ``kv_transfer_params``, or ``prefill_status`` with an error when that is not 200."""

    prefill_status: int = 200
    prefills: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._either)
        app.router.add_post("/v1/completions", self._either)
        return app

    async def _either(self, http: web.Request) -> web.StreamResponse:
        body = await http.json()  # (aiohttp keeps the body: ``_serve`` reads it again)
        if body.get("stream"):
            return await self._serve(http)
        self.prefills += 1
        if self.prefill_status != 200:
            return web.json_response({"error": {"message": "busy"}}, status=self.prefill_status)
        choice = {"index": 0, "text": "w", "finish_reason": "length"}
        return web.json_response({"choices": [choice], "kv_transfer_params": {"remote_engine_id": "p"}})


def prefilled_on_p(request: InferenceRequest) -> RoutingDecision:
    """Decoded on ``e1`` after ``p`` prefilled it."""
    return placed_on_e1(request, policy="fake").model_copy(update={"prefill_instance_id": "p"})


@asynccontextmanager
async def pair(
    prefill: PairEngine, decode: PairEngine
) -> AsyncIterator[tuple[TestClient[web.Request, web.Application], BusFreeGateway]]:
    async with TestServer(prefill.app()) as p, TestServer(decode.app()) as e1:
        instances = [
            {"id": "e1", "url": str(e1.make_url("")).rstrip("/"), "model": MODEL},
            {"id": "p", "url": str(p.make_url("")).rstrip("/"), "model": MODEL},
        ]
        gateway = BusFreeGateway(
            parse_inventory({"instances": instances}), CountingPrompts(), schedule=prefilled_on_p
        )
        async with TestClient(TestServer(gateway.app())) as client:
            yield client, gateway


def first_tokens(gateway: BusFreeGateway) -> list[ResponseStarted]:
    return [e for topic, e in gateway.published if topic == FIRST_TOKENS.name]  # type: ignore[misc]


async def until(check: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def published_first_tokens(prefill_status: int) -> tuple[list[ResponseStarted], PairEngine, PairEngine]:
    prefill, decode = PairEngine(prefill_status=prefill_status), PairEngine()

    async def main() -> list[ResponseStarted]:
        async with pair(prefill, decode) as (client, gateway):
            answer = await client.post("/v1/chat/completions", json=chat_body())
            assert answer.status == 200, await answer.text()
            await until(lambda: len(gateway.completions()) == 1)
            return first_tokens(gateway)

    return asyncio.run(main()), prefill, decode


def test_a_pair_publishes_the_end_of_its_prefill_leg_once_before_the_first_token() -> None:
    started, prefill, decode = published_first_tokens(200)
    assert prefill.prefills == 1 and decode.bodies[-1]["kv_transfer_params"] == {"remote_engine_id": "p"}
    assert [(e.instance_id, e.prefill_leg) for e in started] == [("p", True), ("e1", False)]
    leg, first = started
    assert (leg.request_id, leg.attempt) == (first.request_id, first.attempt)
    assert 0 <= leg.ttft_s <= first.ttft_s and leg.ts <= first.ts


def test_a_prefill_that_fell_back_to_local_prefill_publishes_only_the_first_token() -> None:
    started, prefill, decode = published_first_tokens(503)
    assert prefill.prefills == 1 and "kv_transfer_params" not in decode.bodies[-1]
    assert [(e.instance_id, e.prefill_leg) for e in started] == [("e1", False)]
