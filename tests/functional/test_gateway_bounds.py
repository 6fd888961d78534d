"""The gateway as served (``gateway.server.serve``: its real HTTP app on a loopback port, the
bus, the decider and the engine faked as in ``tests/unit/gateway/fakes.py``) bounds what clients
hold: calls are answered while hundreds of idle connections and a few slowloris clients are
held; the slow ones are cut after the header timeout, the idle ones after the idle timeout, and
connections beyond the cap are refused with a 503 while those open are served."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from gateway.server import GatewayOptions, serve
from infra import metrics
from infra.kafka.broker import free_port
from infra.vllm.inventory import parse_inventory
from lab.gateway_hold import HoldOptions, measure
from tests.unit.gateway.fakes import MODEL, BusFreeGateway, CountingPrompts, FakeEngine, chat_body

HEADERS_START = b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Slow: "


def cuts(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value("tokenfleet_gateway_connections_cut_total", {"reason": reason})
    return value or 0.0


def connections_open() -> float:
    return metrics.REGISTRY.get_sample_value("tokenfleet_gateway_connections_open") or 0.0


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextlib.asynccontextmanager
async def served(engine: FakeEngine | None = None, **options: Any) -> AsyncIterator[str]:
    """The gateway served by ``serve`` with ``options``; yields its base URL."""
    async with TestServer((engine or FakeEngine()).app()) as engine_server:
        url = str(engine_server.make_url("")).rstrip("/")
        inventory = parse_inventory({"instances": [{"id": "e1", "url": url, "model": MODEL}]})
        gateway = BusFreeGateway(inventory, CountingPrompts(), GatewayOptions(**options))
        port, stop = free_port(), asyncio.Event()
        task = asyncio.ensure_future(serve(gateway, "127.0.0.1", port, stop))
        for _ in range(200):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)  # the probe connection's close is seen
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


async def calls(url: str, count: int, concurrency: int = 6) -> list[float]:
    """``count`` chat calls, ``concurrency`` at a time; each one's seconds (all must be 200)."""
    took: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            start = time.monotonic()
            async with session.post(f"{url}/v1/chat/completions", json=chat_body()) as answer:
                assert answer.status == 200, await answer.text()
                await answer.read()
            took.append(time.monotonic() - start)

        queue = list(range(count))

        async def worker() -> None:
            while queue:
                queue.pop()
                await one()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return took


async def slowloris(port: int, byte_every_s: float) -> tuple[float, bytes]:
    """A client that sends a request's headers a byte at a time, for ever: seconds until the
    gateway cut it (from its first byte) and what it said."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.monotonic()

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError):
            for byte in HEADERS_START + b"a" * 10_000:
                writer.write(bytes([byte]))
                await asyncio.sleep(byte_every_s)

    sender = asyncio.ensure_future(trickle())
    try:
        data = await reader.read()
    finally:
        sender.cancel()
        writer.close()
    return time.monotonic() - start, data


def test_calls_are_answered_while_idle_and_slow_clients_are_held_and_the_slow_ones_cut() -> None:
    async def main() -> None:
        async with served(header_timeout_s=0.6, idle_timeout_s=30.0) as url:
            port = int(url.rsplit(":", 1)[1])
            before = {r: cuts(r) for r in ("header_timeout", "idle", "over_cap")}
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(250)]
            slow = [asyncio.ensure_future(slowloris(port, 0.05)) for _ in range(5)]
            await asyncio.sleep(0.1)
            assert connections_open() >= 255
            took = await calls(url, 60)
            assert len(took) == 60 and max(took) < 2.0
            cut = await asyncio.gather(*slow)
            for seconds, said in cut:
                assert 0.55 <= seconds < 1.5, seconds
                assert said.startswith(b"HTTP/1.1 408 ")
            assert cuts("header_timeout") == before["header_timeout"] + 5
            # The idle connections are held still: nothing of theirs was cut.
            assert cuts("idle") == before["idle"] and cuts("over_cap") == before["over_cap"]
            for reader, _ in idle[:10]:
                assert not reader.at_eof()
            for _, writer in idle:
                writer.close()

    asyncio.run(main())


def test_idle_connections_are_closed_and_their_files_freed() -> None:
    async def main() -> None:
        async with served(idle_timeout_s=0.5) as url:
            port = int(url.rsplit(":", 1)[1])
            await calls(url, 6)
            files = open_fds()
            before = cuts("idle")
            idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(100)]
            await asyncio.sleep(0.1)
            assert open_fds() >= files + 200  # both ends are in this process
            ends = await asyncio.wait_for(asyncio.gather(*(r.read() for r, _ in idle)), 3.0)
            assert ends == [b""] * 100
            for _, writer in idle:
                writer.close()
            await asyncio.sleep(0.1)
            assert cuts("idle") >= before + 100  # and the calls' pooled connections, closed by now
            assert open_fds() <= files + 5
            assert len(await calls(url, 6)) == 6

    asyncio.run(main())


def test_beyond_the_cap_new_connections_get_503_while_a_call_in_progress_finishes() -> None:
    async def main() -> None:
        async with served(FakeEngine(chunks=20, delay_s=0.05), max_connections=4) as url:
            port = int(url.rsplit(":", 1)[1])
            running = asyncio.ensure_future(calls(url, 1, concurrency=1))  # ~1 s of streaming
            await asyncio.sleep(0.2)
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            await asyncio.sleep(0.05)
            before = cuts("over_cap")
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"{url}/v1/chat/completions", json=chat_body()) as answer,
            ):
                assert answer.status == 503 and answer.headers["Retry-After"] == "1"
                assert (await answer.json())["error"]["code"] == "too_many_connections"
            assert cuts("over_cap") == before + 1
            assert len(await running) == 1  # the call in progress was answered
            for _, writer in held:
                writer.close()
            await asyncio.sleep(0.1)
            assert len(await calls(url, 3, concurrency=3)) == 3  # room again

    asyncio.run(main())


def test_the_hold_benchmark_measures_a_gateway_it_is_given() -> None:
    async def main() -> None:
        async with served(header_timeout_s=0.5) as url:
            options = HoldOptions(calls=30, idle=20, slow=2, byte_every_s=0.05, hold_max_s=5.0, model=MODEL)
            report = await measure(url, os.getpid(), options, rounds=2)
        assert report["alone"]["answered"] == 90 and report["held"]["answered"] == 60
        assert report["alone"]["errors"] == report["held"]["errors"] == {}
        assert report["slow"]["cut"] >= 4 and 0.45 <= report["slow"]["cut_after_s"]["min"] < 1.5
        assert report["slow"]["answers"]["HTTP/1.1 408 Request Timeout"] >= 4
        assert report["idle"]["held"] == 20 and report["idle"]["cut_while_held"] == 0
        assert report["gateway_cuts"]["header_timeout"] >= 4
        files = report["gateway_open_files"]  # both ends in this process
        assert files["held"] >= files["before"] + 2 * 22 and files["after"] <= files["before"] + 5

    asyncio.run(main())


def test_two_gateways_on_one_port_and_one_stops_the_other_takes_the_new_calls() -> None:
    """With ``reuse_port`` two gateway processes share a port (here two servers in one process,
    as the kernel sees two sockets): the calls go on when one stops listening."""

    async def main() -> None:
        async with TestServer(FakeEngine().app()) as engine_server:
            url = str(engine_server.make_url("")).rstrip("/")
            inventory = parse_inventory({"instances": [{"id": "e1", "url": url, "model": MODEL}]})
            port = free_port()
            gateways = [BusFreeGateway(inventory, CountingPrompts(), GatewayOptions()) for _ in range(2)]
            stops = [asyncio.Event(), asyncio.Event()]
            tasks = [
                asyncio.ensure_future(serve(g, "127.0.0.1", port, stop, reuse_port=True))
                for g, stop in zip(gateways, stops, strict=True)
            ]
            await asyncio.sleep(0.5)
            assert not any(task.done() for task in tasks)  # both listen on the port
            await calls(f"http://127.0.0.1:{port}", 12)
            stops[0].set()
            await asyncio.wait_for(tasks[0], 10)
            took = await calls(f"http://127.0.0.1:{port}", 12)  # fresh connections: the survivor
            assert len(took) == 12
            assert len(gateways[1].requests()) >= 12
            stops[1].set()
            await asyncio.wait_for(tasks[1], 10)

    asyncio.run(main())


def test_port_0_serves_on_a_free_port_and_logs_it(caplog: Any) -> None:
    """``tokenfleet gateway --port 0`` (as ``tokenfleet up --port 0``): any free port, and the log
    says which, so a caller can find it."""
    import logging
    import re

    async def main() -> None:
        inventory = parse_inventory(
            {"instances": [{"id": "e1", "url": "http://127.0.0.1:1", "model": MODEL}]}
        )
        gateway = BusFreeGateway(inventory, CountingPrompts(), GatewayOptions())
        stop = asyncio.Event()
        with caplog.at_level(logging.INFO, logger="gateway.server"):
            task = asyncio.ensure_future(serve(gateway, "127.0.0.1", 0, stop))
            for _ in range(200):
                found = re.search(r"gateway listening on http://127\.0\.0\.1:(\d+) ", caplog.text)
                if found:
                    break
                await asyncio.sleep(0.02)
        assert found is not None, caplog.text
        port = int(found.group(1))
        try:
            assert port != 0
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/health") as answer,
            ):
                assert answer.status == 200
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)

    asyncio.run(main())
