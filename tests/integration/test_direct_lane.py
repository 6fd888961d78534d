"""A gateway call asks its decider directly (``streams/direct.py``): real worker processes, the
real gateway, the embedded broker, an engine stand-in. The decider is killed while the call
waits in its hold: the call costs one more attempt on the other decider and is answered once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import zlib
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from gateway.server import Gateway, GatewayOptions
from infra.kafka.connection import KafkaConnection
from infra.vllm.inventory import parse_inventory
from schemas.events import InferenceRequest
from schemas.topics import DECISIONS, HEARTBEATS, REQUESTS
from tests.integration.streaming import Collector, heartbeat, publish, unique
from tests.integration.streaming import worker as worker_process
from tests.integration.test_worker import decisions
from tests.unit.gateway.fakes import CountingPrompts, FakeEngine


def test_a_decider_killed_while_a_call_waits_costs_one_attempt_and_the_call_is_answered_once(
    broker: str, tmp_path: Path
) -> None:
    app_id, pool = unique("app"), unique("pool")
    one, two = worker_process(broker, app_id, tmp_path / "a"), worker_process(broker, app_id, tmp_path / "b")
    text = "a prompt whose decider dies " * 8
    key = f"{pool}/{zlib.crc32(text.encode()):x}".encode()  # its affinity key (CountingPrompts' hash)

    async def scenario() -> tuple[int, list[InferenceRequest], list[bytes], int]:
        await asyncio.to_thread(one.wait_ready)
        await asyncio.to_thread(two.wait_ready)
        engine = FakeEngine()
        async with TestServer(engine.app()) as engine_server:
            url = str(engine_server.make_url("")).rstrip("/")
            inventory = parse_inventory({"instances": [{"id": "i-1", "url": url, "model": pool}]})
            options = GatewayOptions(app_id=app_id, decision_timeout_s=60.0)
            gateway = Gateway(KafkaConnection.plaintext(broker), inventory, CountingPrompts(), options)
            async with TestClient(TestServer(gateway.app())) as client:
                for _ in range(200):  # both deciders announced, with partitions
                    known = [s for s in gateway.deciders._known.values() if s.partitions]
                    if len(known) == 2:
                        break
                    await asyncio.sleep(0.1)
                async with (
                    Collector(broker, REQUESTS, key) as recorded,
                    Collector(broker, DECISIONS, key) as routed,
                ):
                    body = {"model": pool, "messages": [{"role": "user", "content": text}], "max_tokens": 3}
                    call = asyncio.ensure_future(client.post("/v1/chat/completions", json=body))
                    # No instance of the pool has reported: the decider holds the call. Kill it.
                    (first,) = await recorded.wait_for(1)
                    decider = json.loads(first)["decided_by"]
                    os.kill(int(decider.rsplit(":", 1)[1]), signal.SIGKILL)
                    await asyncio.sleep(0.5)
                    beats = asyncio.ensure_future(_beat(broker, pool))
                    answer = await call
                    status, text_back = answer.status, await answer.text()
                    assert status == 200, text_back
                    await asyncio.sleep(2.0)  # anything decided or run twice would show up now
                    beats.cancel()
                    asked = [InferenceRequest.model_validate_json(v) for v in recorded.values]
                    return status, asked, list(routed.values), len(engine.bodies)

    try:
        status, asked, routed, runs = asyncio.run(scenario())
    finally:
        one.stop()
        two.stop()
    assert status == 200 and runs == 1  # answered, run once
    assert [(r.attempt, bool(r.decided_by)) for r in asked] == [(1, True), (2, True)]
    assert asked[0].decided_by != asked[1].decided_by  # the second attempt by the survivor
    (placed,) = decisions(routed)  # one placement, the survivor's, for attempt 2
    assert placed.attempt == 2 and placed.worker == asked[1].decided_by


async def _beat(broker: str, pool: str) -> None:
    while True:
        await publish(broker, HEARTBEATS, [heartbeat(pool, "i-1")])
        await asyncio.sleep(0.5)
