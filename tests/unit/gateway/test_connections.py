"""The gateway's connection bounds (``gateway/connections.py``) on a real aiohttp server on
loopback, driven with raw sockets; and the aiohttp behaviour they rely on, pinned: if a new
aiohttp changes its keep-alive timeout, these tests say so."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from gateway.connections import (
    FDS_PER_CONNECTION,
    RESERVED_FDS,
    ConnectionGuard,
    ConnectionLimits,
    fit_to_fd_limit,
)
from gateway.server import GatewayOptions
from infra import metrics
from infra.settings import Settings

REQUEST = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"


def cuts(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value("tokenfleet_gateway_connections_cut_total", {"reason": reason})
    return value or 0.0


async def _hello(_request: web.Request) -> web.Response:
    return web.Response(text="hi")


async def _slow(_request: web.Request) -> web.Response:
    await asyncio.sleep(0.8)
    return web.Response(text="done")


async def _early(_request: web.Request) -> web.Response:
    return web.Response(status=401, text="no")  # answers without reading the body


def _app() -> web.Application:
    app = web.Application()
    app.router.add_get("/hello", _hello)
    app.router.add_get("/slow", _slow)
    app.router.add_post("/early", _early)
    return app


@asynccontextmanager
async def guarded(
    header_s: float, idle_s: float, cap: int = 100
) -> AsyncIterator[tuple[int, ConnectionGuard]]:
    guard = ConnectionGuard(ConnectionLimits(header_s, idle_s, cap))
    runner = guard.runner(_app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    server = await guard.listen(runner, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], guard
    finally:
        server.close()
        await runner.cleanup()


@asynccontextmanager
async def plain_aiohttp(idle_s: float) -> AsyncIterator[int]:
    """aiohttp alone (``web.TCPSite``), with its keep-alive timeout: what the guard builds on."""
    runner = web.AppRunner(_app(), keepalive_timeout=idle_s, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site.port
    finally:
        await runner.cleanup()


async def closed_after(reader: asyncio.StreamReader, limit_s: float = 5.0) -> tuple[float, bytes]:
    """Seconds until the server closed the connection, and what it sent before."""
    start = time.monotonic()
    data = await asyncio.wait_for(reader.read(), limit_s)
    return time.monotonic() - start, data


async def response(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    return head + await reader.readexactly(length)


# -- aiohttp's keep-alive timeout, as the idle timeout relies on it -----------------------------


def test_aiohttp_closes_a_connection_that_sends_nothing_after_its_keepalive_timeout() -> None:
    async def main() -> None:
        async with plain_aiohttp(0.4) as port:
            reader, _ = await asyncio.open_connection("127.0.0.1", port)
            took, data = await closed_after(reader)
            assert data == b"" and 0.35 <= took < 1.5

    asyncio.run(main())


def test_aiohttp_closes_a_connection_idle_after_a_response_and_not_during_a_long_call() -> None:
    async def main() -> None:
        async with plain_aiohttp(0.4) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")  # 0.8 s: twice the timeout
            assert (await response(reader)).endswith(b"done")
            took, data = await closed_after(reader)
            assert data == b"" and 0.35 <= took < 1.5

    asyncio.run(main())


def test_aiohttp_closes_a_request_whose_headers_are_incomplete_at_the_keepalive_deadline() -> None:
    async def main() -> None:
        async with plain_aiohttp(0.6) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            start = time.monotonic()
            writer.write(b"GET /hello HTTP/1.1\r\n")  # and never the rest
            _, data = await closed_after(reader)
            assert data == b"" and 0.55 <= time.monotonic() - start < 1.5

    asyncio.run(main())


# -- the guard ------------------------------------------------------------------------------------


def test_headers_trickled_are_cut_header_timeout_after_their_first_byte_with_408() -> None:
    async def main() -> None:
        async with guarded(header_s=0.4, idle_s=5.0) as (port, guard):
            before = cuts("header_timeout")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.sleep(0.3)  # idle first: the header clock starts at the first byte
            start = time.monotonic()

            async def trickle() -> None:
                for byte in b"GET /hello HTTP/1.1\r\nX-Slow: " + b"a" * 100:
                    writer.write(bytes([byte]))
                    await asyncio.sleep(0.05)

            sender = asyncio.ensure_future(trickle())
            _, data = await closed_after(reader)
            sender.cancel()
            took = time.monotonic() - start
            assert 0.38 <= took < 1.0, took
            assert data.startswith(b"HTTP/1.1 408 ") and b'"code": "request_timeout"' in data
            assert cuts("header_timeout") == before + 1
            await asyncio.sleep(0.05)
            assert guard.open == 0

    asyncio.run(main())


def test_a_call_longer_than_both_timeouts_is_not_cut_and_its_connection_is_reused() -> None:
    async def main() -> None:
        async with guarded(header_s=0.3, idle_s=0.5) as (port, _guard):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(2):
                writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
                assert (await response(reader)).endswith(b"done")
            writer.write(REQUEST + REQUEST)  # pipelined
            assert (await response(reader)).endswith(b"hi")
            assert (await response(reader)).endswith(b"hi")

    asyncio.run(main())


def test_idle_connections_are_closed_after_the_idle_timeout_and_counted() -> None:
    async def main() -> None:
        async with guarded(header_s=5.0, idle_s=0.5) as (port, guard):
            before = cuts("idle")
            fresh = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
            used, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)
            assert (await response(used)).endswith(b"hi")
            await asyncio.sleep(0.05)
            assert guard.open == 21
            start = time.monotonic()
            closed = await asyncio.gather(*(closed_after(r) for r, _ in [*fresh, (used, writer)]))
            assert all(data == b"" for _, data in closed)
            assert time.monotonic() - start < 1.5
            await asyncio.sleep(0.05)
            assert cuts("idle") == before + 21 and guard.open == 0

    asyncio.run(main())


def test_a_body_the_handler_did_not_read_does_not_start_the_header_clock() -> None:
    async def main() -> None:
        async with guarded(header_s=0.3, idle_s=5.0) as (port, _guard):
            before = cuts("header_timeout")
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            assert b" 401 " in await response(reader)
            await asyncio.sleep(0.1)
            writer.write(b"defghij")  # the rest of the body, after the answer
            await asyncio.sleep(0.6)  # twice the header timeout: the connection is idle, not slow
            writer.write(REQUEST)
            assert (await response(reader)).endswith(b"hi")
            assert cuts("header_timeout") == before

    asyncio.run(main())


def test_over_the_cap_a_new_connection_gets_503_and_those_open_are_served() -> None:
    async def main() -> None:
        async with guarded(header_s=5.0, idle_s=5.0, cap=3) as (port, guard):
            before = cuts("over_cap")
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            await asyncio.sleep(0.05)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)  # its request is read and dropped: the 503 is not lost to a reset
            took, data = await closed_after(reader)
            assert data.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1\r\n" in data
            assert b'"code": "too_many_connections"' in data and took < 0.5
            assert cuts("over_cap") == before + 1 and guard.open == 3
            for r, w in held:  # the connections held are served as before
                w.write(REQUEST)
                assert (await response(r)).endswith(b"hi")
            held[0][1].close()
            await asyncio.sleep(0.05)
            r, w = await asyncio.open_connection("127.0.0.1", port)  # room again
            w.write(REQUEST)
            assert (await response(r)).endswith(b"hi")

    asyncio.run(main())


def test_a_refused_client_that_never_closes_is_closed_after_the_grace() -> None:
    async def main() -> None:
        async with guarded(header_s=5.0, idle_s=5.0, cap=1) as (port, guard):
            _held = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.sleep(0.05)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            _, data = await closed_after(reader)  # the answer, then the end of what it sends
            assert data.startswith(b"HTTP/1.1 503 ") and len(guard.refusing) == 1
            writer.write(b"GET / HTTP/1.1\r\n")  # read and dropped
            await asyncio.sleep(1.2)
            assert guard.refusing == set()
            with pytest.raises(ConnectionError):  # closed after the grace: its socket is gone
                for _ in range(50):
                    writer.write(b"x" * 1000)
                    await writer.drain()
                    await asyncio.sleep(0.01)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("cap", "soft", "hard", "expected"),
    [
        (100, 1024, 4096, (100, 1024)),  # room already
        (10_000, 1024, 1_048_576, (10_000, 10_000 * FDS_PER_CONNECTION + RESERVED_FDS)),  # raised
        (10_000, 1024, 4096, ((4096 - RESERVED_FDS) // FDS_PER_CONNECTION, 4096)),  # hard too low
        (10_000, 1024, -1, (10_000, 10_000 * FDS_PER_CONNECTION + RESERVED_FDS)),  # unlimited hard
        (10_000, -1, -1, (10_000, -1)),  # unlimited
        (10, 100, 100, (1, 100)),  # never below one connection, never lowered
    ],
)
def test_the_cap_fits_the_open_file_limit(cap: int, soft: int, hard: int, expected: tuple[int, int]) -> None:
    assert fit_to_fd_limit(cap, soft, hard) == expected


def test_the_gateway_options_default_to_the_settings_defaults() -> None:
    fields, options = Settings.model_fields, GatewayOptions()
    assert fields["gateway_header_timeout_s"].default == options.header_timeout_s
    assert fields["gateway_idle_timeout_s"].default == options.idle_timeout_s
    assert fields["gateway_max_connections"].default == options.max_connections


def test_tokenfleet_gateway_takes_the_bounds_from_the_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import cli.service
    import gateway.server
    from cli.main import main

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("instances: [{id: e1, url: 'http://127.0.0.1:1', model: m}]\n")
    monkeypatch.setenv("TOKENFLEET_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("TOKENFLEET_GATEWAY_HEADER_TIMEOUT_S", "3.5")
    monkeypatch.setenv("TOKENFLEET_GATEWAY_IDLE_TIMEOUT_S", "20")
    monkeypatch.setenv("TOKENFLEET_GATEWAY_MAX_CONNECTIONS", "50")
    monkeypatch.setattr(cli.service, "require_broker", lambda *_args, **_kwargs: None)
    monkeypatch.setattr(gateway.server, "Gateway", lambda *args: args[3])  # its options
    served: list[GatewayOptions] = []

    async def serve(options: GatewayOptions, *_args: object) -> None:
        served.append(options)

    monkeypatch.setattr(gateway.server, "serve", serve)
    assert main(["gateway", "--inventory", str(inventory)]) == 0
    (options,) = served
    assert (options.header_timeout_s, options.idle_timeout_s, options.max_connections) == (3.5, 20.0, 50)


def test_tokenfleet_gateway_port_0_means_any_free_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import cli.service
    import gateway.server
    from cli.main import main

    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("instances: [{id: e1, url: 'http://127.0.0.1:1', model: m}]\n")
    monkeypatch.setenv("TOKENFLEET_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setattr(cli.service, "require_broker", lambda *_args, **_kwargs: None)
    monkeypatch.setattr(gateway.server, "Gateway", lambda *args: args[3])
    ports: list[object] = []

    async def serve(_options: GatewayOptions, _host: str, port: int, *_args: object) -> None:
        ports.append(port)

    monkeypatch.setattr(gateway.server, "serve", serve)
    assert main(["gateway", "--inventory", str(inventory), "--port", "0"]) == 0
    assert ports == [0]  # serve binds any free port and logs it (tests/functional/test_gateway_bounds.py)
