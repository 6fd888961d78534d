"""The gateway's real HTTP app with what surrounds it faked: an engine (an aiohttp server that
streams like vLLM), the bus (published events are kept; a ``schedule`` function answers each
request through the gateway's real ``DecisionWaiter``) and the tokenizer (a character count)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.server import Gateway
from infra import metrics
from infra.prompts import PromptError, Prompts
from infra.vllm.inventory import parse_inventory
from schemas.codec import encode
from schemas.events import AdmissionDecision, Completion, Event, InferenceRequest, RoutingDecision
from schemas.topics import ADMISSION, COMPLETIONS, DECISIONS, REQUESTS, TopicSpec

MODEL = "tiny"
Answer = RoutingDecision | AdmissionDecision


@dataclass
class FakeEngine:
    """Streams ``chunks`` pieces ``delay_s`` apart like vLLM's OpenAI server; or refuses with
    ``refuse`` (status, JSON body); or breaks the stream after ``die_after`` pieces."""

    chunks: int = 3
    delay_s: float = 0.0
    refuse: tuple[int, Any] | None = None
    die_after: int | None = None
    bodies: list[dict[str, Any]] = field(default_factory=list)
    hung_up: int = 0  # calls whose client (the gateway) left before the end

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._serve)
        app.router.add_post("/v1/completions", self._serve)
        return app

    async def _serve(self, http: web.Request) -> web.StreamResponse:
        body = await http.json()
        self.bodies.append(body)
        if self.refuse is not None:
            status, answer = self.refuse
            return web.json_response(answer, status=status)
        chat = http.path.endswith("chat/completions")
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(http)
        try:
            for i in range(self.chunks):
                if self.die_after is not None and i == self.die_after:
                    assert http.transport is not None
                    http.transport.close()
                    return stream
                piece = f"w{i} "
                choice: dict[str, Any] = {"index": 0, "finish_reason": None}
                if chat:
                    choice["delta"] = {"content": piece}
                else:
                    choice["text"] = piece
                if i == self.chunks - 1:
                    choice["finish_reason"] = "length"
                event = {"id": "engine-own-id", "model": body["model"], "choices": [choice]}
                await stream.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
            usage = {"prompt_tokens": 5, "completion_tokens": self.chunks, "total_tokens": 5 + self.chunks}
            await stream.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
            await stream.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionError):
            self.hung_up += 1
            raise
        return stream


class CountingPrompts(Prompts):
    """A tokenizer stand-in: a token per four characters; the prompt ``EMPTY`` tokenizes to nothing."""

    def __init__(self) -> None:
        super().__init__({})

    def complete(self, request: InferenceRequest) -> InferenceRequest:
        if request.prompt_token_ids is not None:
            return request
        text = request.prompt or "".join(m.content for m in request.messages or ())
        if text == "EMPTY":
            raise PromptError("the prompt is empty once tokenized")
        return request.model_copy(update={"input_tokens": len(text) // 4 + 1})


def place(request: InferenceRequest) -> Answer:
    """The scheduler's answer: run it on the one engine."""
    return RoutingDecision(
        request_id=request.request_id,
        attempt=request.attempt,
        tenant=request.tenant,
        model=request.model,
        slo_class=request.slo_class or "interactive",
        dc="local",
        instance_id="e1",
        policy="fake",
        decision_latency_s=0.0,
        request=request,
    )


class BusFreeGateway(Gateway):
    """The gateway without a broker: what it publishes is kept in ``published``; each request
    it publishes is answered by ``schedule`` (after ``decision_delay_s``) through its waiter."""

    def __init__(
        self,
        *args: Any,
        schedule: Callable[[InferenceRequest], Answer | None] = place,
        decision_delay_s: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__("unused:9092", *args, **kwargs)
        self.schedule = schedule
        self.decision_delay_s = decision_delay_s
        self.published: list[tuple[str, Event]] = []

    async def start(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        if self._background:
            await asyncio.wait(self._background, timeout=5.0)
        if self._session is not None:
            await self._session.close()

    async def _publish(self, spec: TopicSpec, event: Event, wait: bool = False) -> None:
        self.published.append((spec.name, event))
        if spec is REQUESTS:
            assert isinstance(event, InferenceRequest)
            answer = self.schedule(event)
            if answer is not None:
                topic = DECISIONS if isinstance(answer, RoutingDecision) else ADMISSION
                loop = asyncio.get_running_loop()
                loop.call_later(self.decision_delay_s, self.waiter._offer, topic.name, encode(answer))

    def requests(self) -> list[InferenceRequest]:
        return [e for topic, e in self.published if topic == REQUESTS.name]  # type: ignore[misc]

    def completions(self) -> list[Completion]:
        return [e for topic, e in self.published if topic == COMPLETIONS.name]  # type: ignore[misc]


@dataclass
class Stack:
    client: TestClient
    gateway: BusFreeGateway
    engine: FakeEngine
    engine_url: str

    @property
    def base_url(self) -> str:
        return str(self.client.make_url("/v1"))


@asynccontextmanager
async def running(engine: FakeEngine | None = None, **gateway_args: Any) -> AsyncIterator[Stack]:
    engine = engine or FakeEngine()
    async with TestServer(engine.app()) as engine_server:
        url = str(engine_server.make_url("")).rstrip("/")
        inventory = parse_inventory({"instances": [{"id": "e1", "url": url, "model": MODEL}]})
        gateway = BusFreeGateway(inventory, CountingPrompts(), **gateway_args)
        async with TestClient(TestServer(gateway.app())) as client:
            yield Stack(client, gateway, engine, url)


def counted(status: str) -> float:
    value = metrics.REGISTRY.get_sample_value("tokenfleet_gateway_requests_total", {"status": status})
    return value or 0.0


def chat_body(text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 3, **extra}


def tracebacks(records: list[logging.LogRecord]) -> list[str]:
    """Log records that carry a traceback or say ERROR: none is expected of a client's doing."""
    return [r.getMessage() for r in records if r.exc_info or r.levelno >= logging.ERROR]
