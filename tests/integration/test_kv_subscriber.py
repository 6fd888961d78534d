"""The KV-event subscriber against real ZMQ sockets, driven with a real vLLM's captured batches.

The engine side is an in-process publisher speaking vLLM 0.32's protocol (``kv_wire.py``'s
module docstring): a publishing socket sending ``[topic, seq, payload]`` and a ROUTER answering
replay requests from its buffer, then the end marker. It publishes on an XPUB socket (a PUB that
also reports subscriptions) so a test can wait until the subscriber is connected instead of
sleeping; subscribers see no difference.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from agents.prompt_blocks import chained_block_hashes
from dispatcher.engines.vllm.kv_events import END_SEQ, KvEventSubscriber
from dispatcher.engines.vllm.kv_wire import decode_kv_batch
from dispatcher.engines.vllm.router_blocks import RouterBlocks
from schemas.events import KvEvent

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
PROMPTS: dict[str, dict[str, list[int]]] = json.loads((FIXTURES / "prompts.json").read_text())
TOPIC = b"kv"


def published(run: int) -> list[bytes]:
    """The payloads a real server published in ``run``; the list index is the seq."""
    out: list[bytes] = []
    for line in (FIXTURES / "kv_events.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["source"] == "pub" and record["run"] == run:
            frames = [base64.b64decode(f) for f in record["frames_b64"]]
            assert int.from_bytes(frames[1], "big") == len(out)
            out.append(frames[2])
    return out


RUN1, RUN2 = published(1), published(2)


def held_after(*payloads: bytes) -> frozenset[int]:
    blocks = RouterBlocks()
    for payload in payloads:
        blocks.apply(decode_kv_batch(payload))
    return blocks.held


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Engine:
    """vLLM's side: publish batches, keep them for replay, answer replay requests."""

    def __init__(self, ctx: zmq.asyncio.Context, *, serve_replay: bool = True) -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.pub.bind_to_random_port('tcp://127.0.0.1')}"
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.replay_endpoint = f"tcp://127.0.0.1:{self.router.bind_to_random_port('tcp://127.0.0.1')}"
        self.buffer: list[tuple[int, bytes]] = []
        self.replay_requests: list[int] = []
        self._server = asyncio.create_task(self._serve()) if serve_replay else None

    async def subscribed(self) -> None:
        assert await asyncio.wait_for(self.pub.recv(), 10) == b"\x01" + TOPIC

    async def publish(self, seq: int, payload: bytes, *, lose: bool = False) -> None:
        """Publish batch ``seq`` (``lose``: only buffer it, as if the subscriber missed it)."""
        self.buffer.append((seq, payload))
        if not lose:
            await self.pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), payload])

    async def _serve(self) -> None:
        while True:
            client, empty, start_bytes = await self.router.recv_multipart()
            start = int.from_bytes(start_bytes, "big")
            self.replay_requests.append(start)
            for seq, payload in self.buffer:
                if seq >= start:
                    await self.router.send_multipart([client, empty, TOPIC, seq.to_bytes(8, "big"), payload])
            await self.router.send_multipart([client, empty, b"", END_SEQ, b""])

    def close(self) -> None:
        if self._server is not None:
            self._server.cancel()
        self.pub.close(linger=0)
        self.router.close(linger=0)


async def until(subscriber: KvEventSubscriber, done: Callable[[], bool]) -> list[KvEvent]:
    """Poll (as the dispatcher does, every few ms) until ``done()``; everything polled."""
    events: list[KvEvent] = []
    for _ in range(2_000):
        events += await subscriber.poll()
        if done():
            return events
        await asyncio.sleep(0.005)
    raise AssertionError(f"not done: {subscriber.stats}")


def run(scenario: Callable[[zmq.asyncio.Context], Coroutine[Any, Any, None]]) -> None:
    ctx = zmq.asyncio.Context()
    try:
        asyncio.run(scenario(ctx))
    finally:
        ctx.destroy(linger=0)


def net_held(events: list[KvEvent]) -> set[int]:
    held: set[int] = set()
    for event in events:
        if event.kind == "stored":
            held |= set(event.block_hashes)
        else:
            held -= set(event.block_hashes)
    return held


def connect(ctx: zmq.asyncio.Context, engine: Engine, replay_timeout_s: float = 1.0) -> KvEventSubscriber:
    return KvEventSubscriber(
        "vllm-0",
        "tiny-llama",
        engine.endpoint,
        engine.replay_endpoint,
        "kv",
        replay_timeout_s=replay_timeout_s,
        context=ctx,
    )


def test_batches_in_order_become_kv_events() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        engine = Engine(ctx)
        subscriber = connect(ctx, engine)
        assert await subscriber.poll() == []
        await engine.subscribed()
        for seq, payload in enumerate(RUN1):
            await engine.publish(seq, payload)
        events = await until(subscriber, lambda: subscriber.stats.batches == len(RUN1))
        first = events[0]
        assert (first.instance_id, first.model, first.kind) == ("vllm-0", "tiny-llama", "stored")
        assert first.block_hashes == chained_block_hashes(PROMPTS["run1"]["A"])
        assert first.ts == decode_kv_batch(RUN1[0]).ts
        assert [e.ts for e in events] == sorted(e.ts for e in events)
        assert net_held(events) == held_after(*RUN1) == subscriber.blocks.held
        stats = subscriber.stats
        assert (stats.gaps, stats.replays, stats.resyncs, stats.last_seq) == (0, 0, 0, 10)
        subscriber.close()
        engine.close()

    run(scenario)


def test_a_gap_is_filled_from_the_replay_endpoint() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        engine = Engine(ctx)
        subscriber = connect(ctx, engine)
        await subscriber.poll()
        await engine.subscribed()
        for seq, payload in enumerate(RUN1):
            await engine.publish(seq, payload, lose=seq in (1, 2, 3, 4))
        events = await until(subscriber, lambda: subscriber.stats.batches == len(RUN1))
        assert engine.replay_requests == [1]
        stats = subscriber.stats
        assert (stats.gaps, stats.replays, stats.resyncs) == (1, 1, 0)
        assert net_held(events) == held_after(*RUN1)
        stored = {h for e in events if e.kind == "stored" for h in e.block_hashes}
        assert set(chained_block_hashes(PROMPTS["run1"]["B"])) <= stored  # B came in batch 1: replayed
        subscriber.close()
        engine.close()

    run(scenario)


def test_joining_a_running_engine_replays_its_history() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        engine = Engine(ctx)
        for seq, payload in enumerate(RUN1[:6]):  # published before the subscriber existed
            await engine.publish(seq, payload, lose=True)
        subscriber = connect(ctx, engine)
        await subscriber.poll()
        await engine.subscribed()
        for seq, payload in enumerate(RUN1[6:], start=6):
            await engine.publish(seq, payload)
        events = await until(subscriber, lambda: subscriber.stats.batches == len(RUN1))
        assert engine.replay_requests == [0]
        assert (subscriber.stats.gaps, subscriber.stats.resyncs) == (1, 0)
        assert net_held(events) == held_after(*RUN1)
        subscriber.close()
        engine.close()

    run(scenario)


def test_a_gap_the_replay_cannot_fill_resyncs() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        engine = Engine(ctx, serve_replay=False)  # the ROUTER is there but never answers
        subscriber = connect(ctx, engine, replay_timeout_s=0.3)
        await subscriber.poll()
        await engine.subscribed()
        for seq in range(3):
            await engine.publish(seq, RUN1[seq])
        before = await until(subscriber, lambda: subscriber.stats.batches == 3)
        assert net_held(before) == held_after(*RUN1[:3]) != set()
        await engine.publish(4, RUN1[4])  # batch 3 is lost
        after = await until(subscriber, lambda: subscriber.stats.batches == 4)
        stats = subscriber.stats
        assert (stats.gaps, stats.replays, stats.resyncs) == (1, 1, 1)
        # Everything known so far is withdrawn; the batch after the gap counts on its own.
        assert after[0].kind == "removed" and set(after[0].block_hashes) == held_after(*RUN1[:3])
        assert net_held(before + after) == held_after(RUN1[4])
        subscriber.close()
        engine.close()

    run(scenario)


def test_without_a_replay_endpoint_a_gap_resyncs_at_once() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        engine = Engine(ctx)
        subscriber = KvEventSubscriber("vllm-0", "tiny-llama", engine.endpoint, None, "kv", context=ctx)
        await subscriber.poll()
        await engine.subscribed()
        await engine.publish(0, RUN1[0])
        await engine.publish(2, RUN1[2])
        await until(subscriber, lambda: subscriber.stats.batches == 2)
        stats = subscriber.stats
        assert (stats.gaps, stats.replays, stats.resyncs) == (1, 0, 1)
        assert engine.replay_requests == []
        subscriber.close()
        engine.close()

    run(scenario)


def test_an_engine_restart_withdraws_its_blocks() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        engine = Engine(ctx)
        subscriber = connect(ctx, engine)
        await subscriber.poll()
        await engine.subscribed()
        for seq in range(4):
            await engine.publish(seq, RUN1[seq])
        await until(subscriber, lambda: subscriber.stats.batches == 4)
        engine.buffer.clear()  # the restarted server's buffer starts empty
        for seq in range(3):
            await engine.publish(seq, RUN2[seq])
        events = await until(subscriber, lambda: subscriber.stats.batches == 7)
        assert events[0].kind == "removed" and set(events[0].block_hashes) == held_after(*RUN1[:4])
        assert net_held(events) == held_after(*RUN2[:3])
        stats = subscriber.stats
        assert (stats.restarts, stats.gaps, stats.resyncs, stats.last_seq) == (1, 0, 0, 2)
        subscriber.close()
        engine.close()

    run(scenario)


def test_bad_messages_are_counted_not_raised() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        engine = Engine(ctx)
        subscriber = connect(ctx, engine)
        await subscriber.poll()
        await engine.subscribed()
        await engine.publish(0, RUN1[0])
        await engine.pub.send_multipart([TOPIC, b"\x01", b"short seq"])
        await engine.pub.send_multipart([TOPIC, (1).to_bytes(8, "big"), b"\xc1 not msgpack"])
        await until(subscriber, lambda: subscriber.stats.bad_messages == 2)
        stats = subscriber.stats
        assert (stats.batches, stats.resyncs, stats.last_seq) == (1, 1, 1)
        assert subscriber.blocks.held == frozenset()
        subscriber.close()
        engine.close()

    run(scenario)


def test_no_engine_at_all() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        port = free_port()
        subscriber = KvEventSubscriber(
            "vllm-0",
            "tiny-llama",
            f"tcp://127.0.0.1:{port}",
            f"tcp://127.0.0.1:{port + 1}",
            "kv",
            context=ctx,
        )
        for _ in range(3):
            assert await subscriber.poll() == []
            await asyncio.sleep(0.05)
        assert subscriber.stats.batches == subscriber.stats.errors == 0
        subscriber.close()
        subscriber.close()
        assert await subscriber.poll() == []

        broken = KvEventSubscriber("vllm-1", "tiny-llama", "tcp://no-such-host-name.invalid:", context=ctx)
        assert await broken.poll() == []
        assert broken.stats.errors == 1
        broken.close()

    run(scenario)
