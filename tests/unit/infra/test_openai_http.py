"""``stream_generation`` against a real HTTP server on loopback: a finished stream leaves its
connection to the next call; an abandoned one closes it (that is how an engine hears of an abort).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from infra.vllm.openai_http import stream_generation

TOKEN = b'data: {"choices":[{"index":0,"text":"x"}]}\n\n'


class SseServer:
    """Streams ``tokens`` events, ``[DONE]``, and only then, in a later write, the response's end
    (as uvicorn does); counts the connections it accepted and the streams whose end could not
    be written (the client had closed the connection)."""

    def __init__(self, tokens: int = 3, gap_s: float = 0.0) -> None:
        self.tokens, self.gap_s = tokens, gap_s
        self.connections: set[object] = set()
        self.cut_short = 0
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.connections.add(request.transport)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for _ in range(self.tokens):
                await response.write(TOKEN)
                await asyncio.sleep(self.gap_s)
            await response.write(b"data: [DONE]\n\n")
            await asyncio.sleep(0.01)
            await response.write_eof()
        except (ConnectionError, aiohttp.ClientConnectionResetError):
            self.cut_short += 1
        return response

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[SseServer]:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        try:
            yield self
        finally:
            await runner.cleanup()


def test_consecutive_calls_to_an_engine_share_one_connection() -> None:
    async def main() -> SseServer:
        async with SseServer().running() as server, aiohttp.ClientSession() as session:
            for _ in range(4):
                generation = await stream_generation(session, server.url, "/v1/completions", {})
                assert generation.text == "xxx"
            return server

    server = asyncio.run(main())
    assert len(server.connections) == 1
    assert server.cut_short == 0


def test_a_cancelled_call_closes_its_connection() -> None:
    async def main() -> SseServer:
        async with SseServer(tokens=50, gap_s=0.01).running() as server, aiohttp.ClientSession() as session:
            call = asyncio.create_task(stream_generation(session, server.url, "/v1/completions", {}))
            await asyncio.sleep(0.1)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
            await asyncio.sleep(0.2)  # the server's next write finds the connection closed
            generation = await stream_generation(session, server.url, "/v1/completions", {})
            assert generation.chunks == 50
            return server

    server = asyncio.run(main())
    assert server.cut_short == 1
    assert len(server.connections) == 2
