"""A client that hangs up, at any point of its call, is recorded as what it was: ``client_closed``
in the gateway's metrics (never ``ok``), its attempt ``aborted`` on the bus, no traceback."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.unit.gateway.fakes import FakeEngine, chat_body, counted, running, tracebacks


async def until(check: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def test_a_hang_up_while_the_scheduler_decides(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with running(decision_delay_s=0.5) as stack:
            call = asyncio.ensure_future(stack.client.post("/v1/chat/completions", json=chat_body()))
            await until(lambda: len(stack.gateway.requests()) == 1)  # asked: the scheduler decides
            call.cancel()  # the client gives up and hangs up
            await until(lambda: counted("client_closed") == before + 1)
            # The decision comes after the client left: the attempt is recorded ended, not running.
            await until(lambda: len(stack.gateway.completions()) == 1)
            (ended,) = stack.gateway.completions()
            assert ended.status == "aborted" and ended.output_tokens == 0
            assert stack.engine.bodies == []

    before = counted("client_closed")
    caplog.set_level(logging.DEBUG)
    asyncio.run(main())
    assert tracebacks(caplog.records) == []


@pytest.mark.parametrize("stream", [True, False])
def test_a_hang_up_during_the_answer_aborts_it_at_the_engine(
    stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with running(FakeEngine(chunks=200, delay_s=0.02)) as stack:
            call = asyncio.ensure_future(
                stack.client.post("/v1/chat/completions", json=chat_body(stream=stream))
            )
            if stream:
                await (await call).content.readline()  # the first event: the answer has started
                (await call).close()  # the client hangs up
            else:  # nothing comes before the whole answer: the client gives up waiting
                await until(lambda: len(stack.engine.bodies) == 1)
                await asyncio.sleep(0.1)
                call.cancel()
            await until(lambda: stack.engine.hung_up == 1)
            await until(lambda: len(stack.gateway.completions()) == 1)
            (ended,) = stack.gateway.completions()
            assert ended.status == "aborted" and 1 <= ended.output_tokens < 200
            await until(lambda: counted("client_closed") == before + 1)

    before, ok = counted("client_closed"), counted("ok")
    caplog.set_level(logging.DEBUG)
    asyncio.run(main())
    assert counted("ok") == ok
    assert tracebacks(caplog.records) == []


@pytest.mark.parametrize("stream", [True, False])
def test_a_hang_up_as_the_answer_ends(
    stream: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The client leaves just as the last bytes go: ending the response finds its connection
    closing (aiohttp's ``ClientConnectionResetError`` from ``write_eof``)."""
    original = web.StreamResponse.write_eof

    async def closing(self: web.StreamResponse, data: bytes = b"") -> None:
        if self._req is not None and "x-test-hang-up" in self._req.headers:  # the gateway's answer
            assert self._req.transport is not None
            self._req.transport.close()
            raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")
        await original(self, data)

    monkeypatch.setattr(web.StreamResponse, "write_eof", closing)

    async def main() -> None:
        async with running() as stack:
            with pytest.raises(aiohttp.ClientError):
                answer = await stack.client.post(
                    "/v1/chat/completions", json=chat_body(stream=stream), headers={"x-test-hang-up": "1"}
                )
                await answer.read()
            await until(lambda: counted("client_closed") == before + 1)
            await until(lambda: len(stack.gateway.completions()) == 1)
            assert stack.gateway.completions()[0].status == "aborted"
            fine = await stack.client.post("/v1/chat/completions", json=chat_body(stream=stream))
            assert fine.status == 200 and b"w2" in await fine.read()

    before, ok = counted("client_closed"), counted("ok")
    caplog.set_level(logging.DEBUG)
    asyncio.run(main())
    assert counted("ok") == ok + 1  # the second call only
    assert tracebacks(caplog.records) == []


def test_a_hang_up_while_sending_the_body(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with running() as stack:
            server = stack.client.server
            _reader, writer = await asyncio.open_connection(server.host, server.port)
            body = json.dumps(chat_body()).encode()
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body) + 100}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            await until(lambda: len(stack.gateway.ids._seen) == 1)  # the call began: it reads the body
            writer.close()
            await until(lambda: counted("client_closed") == before + 1)
            assert stack.gateway.published == []

    before = counted("client_closed")
    caplog.set_level(logging.DEBUG)
    asyncio.run(main())
    assert tracebacks(caplog.records) == []
