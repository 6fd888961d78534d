"""The gateway's real HTTP app with what surrounds it faked: an engine (an aiohttp server that
streams like vLLM), the bus (published events are kept), the scheduler (a ``schedule`` function
answers each request, asked through the real direct lane: the gateway's ``Deciders`` and a
``DirectLane`` server on a local port) and the tokenizer (a character count)."""

from __future__ import annotations

import asyncio
import json
import logging
import zlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from agents.handlers import DirectKey
from gateway.deciders import Deciders
from gateway.server import Gateway
from infra import metrics
from infra.kafka.connection import KafkaConnection
from infra.prompts import PromptError, Prompts
from infra.vllm.inventory import parse_inventory
from lab.gateway_alone import placed_on_e1
from schemas.codec import decode, encode
from schemas.events import (
    AdmissionDecision,
    Completion,
    DeciderAnnouncement,
    Event,
    InferenceRequest,
    RoutingDecision,
)
from schemas.topics import COMPLETIONS, TopicSpec
from streams.direct import DirectLane

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
    engine_ids: list[str | None] = field(default_factory=list)  # each call's X-Request-Id
    hung_up: int = 0  # calls whose client (the gateway) left before the end

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._serve)
        app.router.add_post("/v1/completions", self._serve)
        return app

    async def _serve(self, http: web.Request) -> web.StreamResponse:
        body = await http.json()
        self.bodies.append(body)
        self.engine_ids.append(http.headers.get("X-Request-Id"))
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
    """A tokenizer stand-in: a token per four characters, one block hash (the text's CRC-32);
    the prompt ``EMPTY`` tokenizes to nothing."""

    def __init__(self) -> None:
        super().__init__({})

    def complete(self, request: InferenceRequest) -> InferenceRequest:
        if request.prompt_token_ids is not None:
            return request
        text = request.prompt or "".join(m.content for m in request.messages or ())
        if text == "EMPTY":
            raise PromptError("the prompt is empty once tokenized")
        # One block hash per prompt (its text's CRC): prompts that differ go to different deciders.
        return request.model_copy(
            update={"input_tokens": len(text) // 4 + 1, "prompt_block_hashes": (zlib.crc32(text.encode()),)}
        )


def place(request: InferenceRequest) -> Answer:
    """The scheduler's answer: run it on the one engine."""
    return placed_on_e1(request, policy="fake")


class FakeDecider:
    """A decider whose decisions are ``schedule``'s, ``delay_s`` after it is asked (None: no
    answer ever). ``asked``: what it was asked, in order; ``gone``: calls let go."""

    def __init__(self, schedule: Callable[[InferenceRequest], Answer | None], delay_s: float) -> None:
        self.schedule, self.delay_s = schedule, delay_s
        self.asked: list[InferenceRequest] = []
        self.gone: list[DirectKey] = []

    async def on_direct(self, value: bytes) -> tuple[DirectKey, asyncio.Future[Event]]:
        request = decode(InferenceRequest, value)
        self.asked.append(request)
        answer: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        decision = self.schedule(request)
        if decision is not None:

            def settle(decided: Answer = decision) -> None:
                if not answer.done():
                    answer.set_result(decided)

            asyncio.get_running_loop().call_later(self.delay_s, settle)
        return (request.model, request.request_id, request.attempt), answer

    def on_direct_gone(self, key: DirectKey) -> None:
        self.gone.append(key)


class BusFreeGateway(Gateway):
    """The gateway without a broker: what it publishes is kept in ``published``; each request
    is asked of ``decider`` (a ``FakeDecider``) over a real direct lane."""

    def __init__(
        self,
        *args: Any,
        schedule: Callable[[InferenceRequest], Answer | None] = place,
        decision_delay_s: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(KafkaConnection.plaintext("unused:9092"), *args, **kwargs)
        self.decider = FakeDecider(schedule, decision_delay_s)
        self.lane = DirectLane(self.decider, "127.0.0.1", 0)
        self.published: list[tuple[str, Event]] = []

    async def start(self) -> None:
        import aiohttp

        await self.lane.start()
        announce(self.deciders, "fake:1", self.lane.address, partitions=(0,), partition_count=1)
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        await self.deciders.close()
        await self.lane.stop()
        if self._background:
            await asyncio.wait(self._background, timeout=5.0)
        if self._session is not None:
            await self._session.close()

    async def _publish(self, spec: TopicSpec, event: Event, wait: bool = False) -> None:
        self.published.append((spec.name, event))

    def requests(self) -> list[InferenceRequest]:
        return list(self.decider.asked)

    def completions(self) -> list[Completion]:
        return [e for topic, e in self.published if topic == COMPLETIONS.name]  # type: ignore[misc]


def announce(deciders: Deciders, worker: str, address: str, **fields: Any) -> None:
    """Tell ``deciders`` of a decider, as its announcement on ``tf.deciders`` would."""
    said = DeciderAnnouncement(worker=worker, scheduler=deciders.scheduler, address=address, **fields)
    deciders._heard(encode(said))


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
