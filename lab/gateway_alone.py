"""The gateway alone: the real gateway in front of a decider and an engine that answer at once.

``python -m lab.gateway_alone --port P [--header-timeout-s S] [--idle-timeout-s S]
[--max-connections N]`` serves until SIGTERM / Ctrl-C. In this one process: the embedded broker
(Tansu, its own child process), the real ``Gateway`` served by ``gateway.server.serve`` (its
Kafka producer, its reader of ``tf.deciders``, its direct lane to the decider, its connection
bounds), one decider on a real direct lane (``streams.direct.DirectLane``, announced on
``tf.deciders`` like a worker's) that places every call at once on the one engine, and that
engine: an HTTP server that streams ``CHUNKS`` pieces at once, as vLLM's OpenAI server does. The
prompt is counted a token per four characters (no tokenizer to load).

What it is for: measuring the gateway's own costs (``bench/gateway_hold.py``) without a
scheduler's or an engine's time in the figures. The decider and the engine share the gateway's
event loop, so their (small) work counts as the gateway's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import zlib
from collections.abc import Awaitable
from typing import Any

from aiohttp import web
from aiokafka import AIOKafkaProducer

from agents.handlers import DirectKey
from gateway.server import Gateway, GatewayOptions, serve
from infra.kafka.broker import deciders_group, embedded_broker, ensure_topics_async, free_port
from infra.kafka.clients import send_event, start_client
from infra.kafka.connection import KafkaConnection
from infra.prompts import Prompts
from infra.vllm.inventory import parse_inventory
from schemas.codec import decode
from schemas.events import Event, InferenceRequest, RoutingDecision
from schemas.topics import TopicSpec
from streams.direct import Announcer, DirectLane

MODEL = "alone"
CHUNKS = 8
APP_ID = "gateway-alone"

log = logging.getLogger(__name__)


class CountedPrompts(Prompts):
    """A token per four characters and one block hash (the text's CRC-32): no tokenizer."""

    def __init__(self) -> None:
        super().__init__({})

    def complete(self, request: InferenceRequest) -> InferenceRequest:
        text = request.prompt or "".join(m.content for m in request.messages or ())
        return request.model_copy(
            update={"input_tokens": len(text) // 4 + 1, "prompt_block_hashes": (zlib.crc32(text.encode()),)}
        )


def placed_on_e1(request: InferenceRequest, policy: str = "instant") -> RoutingDecision:
    """The decision that runs ``request`` on instance ``e1``, the one engine."""
    return RoutingDecision(
        request_id=request.request_id,
        attempt=request.attempt,
        tenant=request.tenant,
        model=request.model,
        slo_class=request.slo_class or "interactive",
        dc="local",
        instance_id="e1",
        policy=policy,
        decision_latency_s=0.0,
        request=request,
    )


class InstantDecider:
    """Places every request on instance ``e1`` at once (the direct lane's ``DirectDecider``)."""

    async def on_direct(self, value: bytes) -> tuple[DirectKey, asyncio.Future[Event]]:
        request = decode(InferenceRequest, value)
        answer: asyncio.Future[Event] = asyncio.get_running_loop().create_future()
        answer.set_result(placed_on_e1(request))
        return (request.model, request.request_id, request.attempt), answer

    def on_direct_gone(self, key: DirectKey) -> None:
        pass


async def _engine_answer(http: web.Request) -> web.StreamResponse:
    """``CHUNKS`` streamed pieces, a usage event and ``[DONE]``, as vLLM streams them."""
    body = await http.json()
    chat = http.path.endswith("chat/completions")
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await stream.prepare(http)
    for i in range(CHUNKS):
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if i == CHUNKS - 1 else None}
        choice["delta" if chat else "text"] = {"content": f"w{i} "} if chat else f"w{i} "
        event = {"id": "engine", "model": body["model"], "choices": [choice]}
        await stream.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    usage = {"prompt_tokens": 5, "completion_tokens": CHUNKS, "total_tokens": 5 + CHUNKS}
    await stream.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
    await stream.write(b"data: [DONE]\n\n")
    return stream


async def run(port: int, options: GatewayOptions, stop: asyncio.Event) -> None:
    """Serve the gateway on loopback ``port`` until ``stop`` is set."""
    with embedded_broker() as bootstrap:
        connection = KafkaConnection.plaintext(bootstrap)
        await ensure_topics_async(connection, partitions=1)
        engine_app = web.Application()
        engine_app.router.add_post("/v1/chat/completions", _engine_answer)
        engine_app.router.add_post("/v1/completions", _engine_answer)
        engine = web.AppRunner(engine_app, access_log=None)
        await engine.setup()
        engine_port = free_port()
        await web.TCPSite(engine, "127.0.0.1", engine_port).start()
        producer = await start_client(
            lambda: AIOKafkaProducer(**connection.client_options()), "gateway-alone producer"
        )

        async def send(spec: TopicSpec, events: list[Event]) -> Awaitable[object]:
            return asyncio.gather(*[await send_event(producer, spec, e) for e in events])

        async def one_partition() -> int:
            return 1

        lane = DirectLane(InstantDecider(), "127.0.0.1", 0)
        await lane.start()
        scheduler = deciders_group(options.app_id)
        announcer = Announcer(send, "instant:1", scheduler, lambda: lane.address, lambda: {0}, one_partition)
        await announcer.start()
        inventory = parse_inventory(
            {"instances": [{"id": "e1", "url": f"http://127.0.0.1:{engine_port}", "model": MODEL}]}
        )
        gateway = Gateway(connection, inventory, CountedPrompts(), options)
        try:
            await serve(gateway, "127.0.0.1", port, stop)
        finally:
            await announcer.stop()
            await lane.stop()
            await producer.stop()
            await engine.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.gateway_alone", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    defaults = GatewayOptions()
    parser.add_argument("--header-timeout-s", type=float, default=defaults.header_timeout_s)
    parser.add_argument("--idle-timeout-s", type=float, default=defaults.idle_timeout_s)
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("gateway.server").setLevel(logging.INFO)  # its "listening" line
    options = GatewayOptions(
        app_id=APP_ID,
        header_timeout_s=args.header_timeout_s,
        idle_timeout_s=args.idle_timeout_s,
        max_connections=args.max_connections,
    )

    async def until_signalled() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(args.port, options, stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(until_signalled())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
