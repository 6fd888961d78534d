"""The vLLM engine port following its inventory file (``dispatcher/engines/vllm/adapter.py``, what
``tokenfleet up --planner`` rewrites): an instance added is heartbeat, one taken out heartbeats
``draining`` while its server still answers and is forgotten once it stopped, one listed again
before that serves again, and a file that cannot be read changes nothing. The engines' servers
are a loopback HTTP server answering ``/health`` and ``/metrics`` as vLLM does."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from dispatcher.engines.vllm.adapter import VllmEngines
from infra.files import write_atomic
from infra.vllm.inventory import InstanceEntry, Inventory, ModelEntry, dump_inventory, load_inventory
from local.emulated_vllm.metrics import render
from local.vllm_launcher import free_ports
from schemas.events import Heartbeat

MODEL = "m"
SCRAPE_S = 0.05


def entry(name: str, port: int) -> InstanceEntry:
    url = f"http://127.0.0.1:{port}"
    return InstanceEntry(name, url, MODEL, "1", max_num_seqs=16, max_num_batched_tokens=1024)


def write(path: Path, *entries: InstanceEntry) -> None:
    write_atomic(path, dump_inventory(Inventory({MODEL: ModelEntry(MODEL, "1")}, entries)))


async def serve(port: int) -> web.AppRunner:
    """A server answering ``/health`` and ``/metrics`` (2 calls running) as vLLM does."""
    beat = Heartbeat(
        instance_id="x", dc="dc", model=MODEL, model_version="1", waiting=0, running=2,
        tokens_in_flight=0, kv_blocks_used=1, kv_blocks_total=10,
    )  # fmt: skip

    async def health(_request: web.Request) -> web.Response:
        return web.Response()

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=render(beat, MODEL))

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def beats_after_a_scrape(engines: VllmEngines) -> dict[str, Heartbeat]:
    await engines.load(0.0)  # reads the file, starts the scrapers
    await asyncio.sleep(3 * SCRAPE_S)
    return {b.instance_id: b for b in await engines.load(0.0)}


def test_instances_added_drain_when_taken_out_and_are_forgotten_once_stopped(tmp_path: Path) -> None:
    path = tmp_path / "engines.yaml"
    a_port, b_port = free_ports(2)
    a, b = entry("a", a_port), entry("b", b_port)  # b: nothing listens there (loading)
    write(path, a)

    async def run() -> None:
        server = await serve(a_port)
        engines = VllmEngines(load_inventory(path), scrape_s=SCRAPE_S, kv_events=False, source=path)
        try:
            found = await beats_after_a_scrape(engines)
            assert list(found) == ["a"] and found["a"].endpoint_ready and not found["a"].draining
            assert (found["a"].max_seqs, found["a"].prefill_budget_tokens) == (16, 1024)  # the inventory's

            write(path, a, b)
            found = await beats_after_a_scrape(engines)
            assert [e.instance_id for e in engines.endpoints] == ["a", "b"]
            assert found["a"].endpoint_ready and not found["b"].endpoint_ready
            assert not found["b"].draining

            write(path, b)  # a drains: its server still answers, so it is kept
            for _ in range(2):
                found = await beats_after_a_scrape(engines)
                assert found["a"].draining and found["a"].endpoint_ready and found["a"].running == 2
            assert engines.draining() == {"a"}

            write(path, a, b)  # listed again before it stopped: it serves again
            found = await beats_after_a_scrape(engines)
            assert not found["a"].draining and engines.draining() == set()

            write(path, a)  # b never answered: one beat says it drains, then it is forgotten
            found = await beats_after_a_scrape(engines)
            assert "b" not in found
            write(path, b)
            await engines.load(0.0)
            await server.cleanup()  # a's server stopped
            found = await beats_after_a_scrape(engines)
            assert found["a"].draining and not found["a"].endpoint_ready  # its last beat
            found = await beats_after_a_scrape(engines)
            assert list(found) == ["b"] and [e.instance_id for e in engines.endpoints] == ["b"]

            path.write_text("instances: not a list\n")  # unreadable: the engines stay as they are
            found = await beats_after_a_scrape(engines)
            assert list(found) == ["b"] and not found["b"].draining
        finally:
            await engines.close()
            await server.cleanup()

    asyncio.run(run())


def test_without_a_source_the_instances_never_change(tmp_path: Path) -> None:
    path = tmp_path / "engines.yaml"
    (port,) = free_ports(1)
    write(path, entry("a", port))

    async def run() -> None:
        engines = VllmEngines(load_inventory(path), scrape_s=SCRAPE_S, kv_events=False)
        try:
            write(path, entry("b", port))
            found = await beats_after_a_scrape(engines)
            assert list(found) == ["a"] and not found["a"].draining
        finally:
            await engines.close()

    asyncio.run(run())
