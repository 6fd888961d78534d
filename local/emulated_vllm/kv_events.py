"""The emulated instance's cache changes as vLLM publishes them: its wire format, on ZMQ.

The format is the one ``dispatcher/engines/vllm/kv_wire.py`` documents and decodes (vLLM 0.32):
a PUB socket sends ``[topic, seq (8 bytes big-endian, from 0), payload]`` per engine step that
changed the cache, the payload msgpack ``[ts, [event, ...], 0]`` with tagged-map events; a
ROUTER answers ``[b"", start seq]`` with every buffered batch from that seq, then the end marker.

One vLLM block here is one of TokenFleet's 512-token prefix blocks (the engine model caches
those): ``BlockStored`` carries ``block_size`` 512, the blocks' token ids and, as each block's
vLLM hash, its router hash (``agents.prompt_blocks``) as an unsigned 64-bit int (vLLM's default
int hashes), so the subscriber's mapping (``router_blocks.RouterBlocks``) lands on exactly the
hashes the scheduler computes for a prompt. A run of blocks that continue one another is one
``BlockStored`` whose ``parent_block_hash`` is the block before the run (None at a prompt's
start); each eviction is one ``BlockRemoved``.

The engine model reports blocks by hash only; ``PromptBlocks`` keeps their tokens from the time
a call that holds them is queued until the block is neither held by a call nor cached.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from agents.policy.types import BLOCK_TOKENS
from dispatcher.engines.vllm.kv_events import END_SEQ
from schemas.events import KvEvent

log = logging.getLogger(__name__)

TOPIC = b"kv"  # as local.vllm_launcher configures real servers
REPLAY_BATCHES = 10_000  # vLLM's default buffer_steps
SEND_HIGH_WATER_MARK = 100_000  # vLLM's default hwm
_UINT64 = 2**64


def vllm_hash(router_hash: int) -> int:
    """A router block hash (signed 64-bit) as vLLM publishes an int block hash (unsigned 64-bit)."""
    return router_hash % _UINT64


class PromptBlocks:
    """Each 512-token prompt block's tokens and parent, by router hash, while a call holds it or
    the cache does. ``hold`` when a call is queued, ``let_go`` when it ended (after its cache
    changes were published), ``evicted`` on a removal."""

    def __init__(self, cached: Callable[[int], bool]) -> None:
        self._cached = cached
        self._blocks: dict[int, tuple[int | None, Sequence[int]]] = {}
        self._holders: dict[int, int] = {}

    def hold(self, hashes: Sequence[int], token_ids: Sequence[int]) -> None:
        """A call whose prompt is ``token_ids`` (full blocks hashed ``hashes``) is queued."""
        for index, block in enumerate(hashes):
            self._holders[block] = self._holders.get(block, 0) + 1
            if block not in self._blocks:
                parent = hashes[index - 1] if index else None
                self._blocks[block] = (parent, token_ids[index * BLOCK_TOKENS : (index + 1) * BLOCK_TOKENS])

    def let_go(self, hashes: Sequence[int]) -> None:
        """The call that held ``hashes`` ended."""
        for block in hashes:
            left = self._holders[block] - 1
            if left:
                self._holders[block] = left
                continue
            del self._holders[block]
            if not self._cached(block):
                self._blocks.pop(block, None)

    def evicted(self, block: int) -> None:
        """The cache dropped ``block`` (it may hold it again already: then it is kept)."""
        if block not in self._holders and not self._cached(block):
            self._blocks.pop(block, None)

    def get(self, block: int) -> tuple[int | None, Sequence[int]] | None:
        """(parent hash or None, token ids) of ``block``, or None if unknown."""
        return self._blocks.get(block)


def encode_batch(ts: float, changes: Sequence[KvEvent], blocks: PromptBlocks) -> bytes:
    """The msgpack payload of one batch: ``changes`` (the engine's, in order) as vLLM events. A
    stored block whose tokens are unknown is left out (a subscriber then sees it as not cached)."""
    events: list[dict[str, Any]] = []
    for change in changes:
        if change.kind == "removed":
            events.extend(_removed(block) for block in change.block_hashes)
            continue
        run: list[int] = []
        parent: int | None = None
        tokens: list[int] = []
        for block in change.block_hashes:
            known = blocks.get(block)
            if known is None:
                continue
            if run and known[0] != run[-1]:  # not the next block of the run: a new run
                events.append(_stored(run, parent, tokens))
                run, tokens = [], []
            if not run:
                parent = known[0]
            run.append(block)
            tokens.extend(known[1])
        if run:
            events.append(_stored(run, parent, tokens))
    return msgpack.packb([ts, events, 0])  # type: ignore[no-any-return]


def _stored(run: list[int], parent: int | None, tokens: list[int]) -> dict[str, Any]:
    return {
        "type": "BlockStored",
        "block_hashes": [vllm_hash(block) for block in run],
        "parent_block_hash": None if parent is None else vllm_hash(parent),
        "token_ids": tokens,
        "block_size": BLOCK_TOKENS,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * len(run),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }


def _removed(block: int) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [vllm_hash(block)], "medium": "GPU", "group_idx": 0}


class KvPublisher:
    """Publishes batches on a PUB socket bound at ``endpoint`` and, with ``replay_endpoint``,
    answers replay requests from the last ``REPLAY_BATCHES`` (``serve_replay``, a task)."""

    def __init__(self, endpoint: str, replay_endpoint: str | None, blocks: PromptBlocks) -> None:
        self.blocks = blocks
        self._pub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.set_hwm(SEND_HIGH_WATER_MARK)
        self._pub.bind(endpoint)
        self._replay: zmq.asyncio.Socket | None = None
        if replay_endpoint is not None:
            self._replay = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=REPLAY_BATCHES)
        self._seq = 0

    def publish(self, changes: list[KvEvent]) -> None:
        """Send the engine's ``changes`` of one step as one batch (never blocks: a subscriber too
        slow to take it misses it, and asks for a replay)."""
        payload = encode_batch(time.time(), changes, self.blocks)
        for change in changes:
            if change.kind == "removed":
                for block in change.block_hashes:
                    self.blocks.evicted(block)
        seq = self._seq.to_bytes(8, "big")
        self._buffer.append((self._seq, payload))
        self._seq += 1
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart([TOPIC, seq, payload], flags=zmq.NOBLOCK)

    async def serve_replay(self) -> None:
        """Answer replay requests until cancelled (returns at once without a replay endpoint)."""
        if self._replay is None:
            return
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("KV replay: a request of %d frames ignored", len(frames))
                continue
            client, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await self._replay.send_multipart([client, b"", TOPIC, seq.to_bytes(8, "big"), payload])
            await self._replay.send_multipart([client, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
