"""vLLM's KV-cache events (ZMQ) turned into TokenFleet ``KvEvent``s on 512-token prefix blocks.

``KvEventSubscriber`` reads one engine's publisher (the wire format: ``kv_wire``), follows the
sequence numbers, fills gaps from the replay endpoint, and maps the blocks with
``router_blocks.RouterBlocks``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import zmq
import zmq.asyncio

from agents.policy.types import BLOCK_TOKENS
from dispatcher.engines.vllm.kv_wire import KvBatch, decode_kv_batch
from dispatcher.engines.vllm.router_blocks import RouterBlocks
from schemas.events import MAX_BLOCK_HASHES, MAX_TS, KvEvent

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay endpoint's end-of-answer marker, in the seq frame."""


@dataclass(slots=True)
class SubscriberStats:
    """Counters since the subscriber started. ``gaps``: sequence jumps seen (incl. joining a
    running engine); ``restarts``: the sequence went back (the engine restarted); ``replays``:
    replay requests made; ``resyncs``: times the mapping was reset because missing batches could
    not be recovered (the engine's cache was unknown from then on); ``bad_messages``: frames or
    payloads that could not be read; ``errors``: socket failures."""

    batches: int = 0
    gaps: int = 0
    restarts: int = 0
    replays: int = 0
    resyncs: int = 0
    bad_messages: int = 0
    errors: int = 0
    skipped_blocks: int = 0
    last_seq: int | None = None


@dataclass(slots=True)
class _Replay:
    payloads: dict[int, bytes] = field(default_factory=dict)
    complete: bool = False


class KvEventSubscriber:
    """Reads one engine instance's KV events and reports them as TokenFleet ``KvEvent``s.

    A SUB socket on ``endpoint`` (vLLM's publisher), filtered on ``topic`` (vLLM's
    ``kv_events_config.topic``; a ZMQ prefix filter, "" takes every topic); the batches are
    expected in sequence from 0 (the engine's start). When a batch arrives with ``seq`` above
    the next expected one (missed batches, or joining an engine already running), the missing
    ones are asked from ``replay_endpoint`` (at most ``replay_timeout_s``); if it cannot give
    all of them (none configured, unreachable, or no longer buffered), the mapping is reset —
    every router block held so far is reported ``removed`` — and counted in ``resyncs``: from
    then on the instance's cache holds more than we know, never less. A ``seq`` below the next
    expected one means the engine restarted (an empty cache): the mapping is reset the same
    way, then the new sequence is followed from 0. A batch that cannot be decoded is lost:
    resync. Not detected: an engine restarted and already past our next expected ``seq``.

    ``poll`` never raises for a dead, unreachable or misbehaving engine (ZMQ connects lazily;
    failures are counted in ``stats`` and logged). Driven by one task; ``close`` is idempotent.
    """

    def __init__(
        self,
        instance_id: str,
        model: str,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        *,
        block_tokens: int = BLOCK_TOKENS,
        replay_timeout_s: float = 1.0,
        max_replay_batches: int = 10_000,
        max_batches_per_poll: int = 10_000,
        context: zmq.asyncio.Context | None = None,
    ) -> None:
        if not instance_id:
            raise ValueError("a KV-event subscriber needs the instance id its events are about")
        self.instance_id = instance_id
        self.model = model
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic.encode()
        self.replay_timeout_s = replay_timeout_s
        self.max_replay_batches = max_replay_batches
        self.max_batches_per_poll = max_batches_per_poll
        self.blocks = RouterBlocks(block_tokens)
        self._context = context
        self._sub: zmq.asyncio.Socket | None = None
        self._next_seq = 0
        self._last_ts = 0.0
        self._stats = SubscriberStats()
        self._closed = False

    @property
    def stats(self) -> SubscriberStats:
        """A copy of the counters."""
        return replace(self._stats, skipped_blocks=self.blocks.skipped_blocks)

    async def poll(self) -> list[KvEvent]:
        """The ``KvEvent``s of every batch received since the last call (``ts`` = the batch's).
        Does not wait for messages; only a replay waits, at most ``replay_timeout_s``."""
        if self._closed:
            return []
        out: list[KvEvent] = []
        try:
            sub = self._socket()
            for _ in range(self.max_batches_per_poll):
                try:
                    frames = await sub.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                await self._receive(frames, out)
        except zmq.ZMQError as exc:
            self._stats.errors += 1
            # Once per subscriber at warning level: a dead engine fails every poll.
            report = log.warning if self._stats.errors == 1 else log.debug
            report("KV events of %s (%s): %s", self.instance_id, self.endpoint, exc)
            self._drop_socket()
        return out

    def close(self) -> None:
        """Close the sockets; later ``poll`` calls return []."""
        self._closed = True
        self._drop_socket()

    def _socket(self) -> zmq.asyncio.Socket:
        if self._sub is None:
            sub = self._ctx().socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic)
            try:
                sub.connect(self.endpoint)
            except zmq.ZMQError:
                sub.close(linger=0)
                raise
            self._sub = sub
        return self._sub

    def _drop_socket(self) -> None:
        if self._sub is not None:
            self._sub.close(linger=0)
            self._sub = None

    def _ctx(self) -> zmq.asyncio.Context:
        if self._context is None:
            self._context = zmq.asyncio.Context.instance()
        return self._context

    async def _receive(self, frames: list[bytes], out: list[KvEvent]) -> None:
        parsed = self._frames(frames)
        if parsed is None:
            return
        seq, payload = parsed
        batch = self._decode(payload)
        stamp = batch.ts if batch is not None else time.time()
        if seq < self._next_seq:
            self._stats.restarts += 1
            log.warning("KV events of %s: seq went back to %d (engine restarted)", self.instance_id, seq)
            self._emit(out, "removed", self.blocks.reset(), stamp)
            self._next_seq = 0
        if seq > self._next_seq:
            self._stats.gaps += 1
            replayed = await self._replay(self._next_seq, seq)
            if replayed is None:
                self._resync(out, f"batches {self._next_seq}..{seq - 1} missed, not replayed", stamp)
            else:
                for missed in replayed:
                    self._apply(self._decode(missed), out, stamp)
        self._next_seq = seq + 1
        self._stats.last_seq = seq
        self._apply(batch, out, stamp)

    def _frames(self, frames: Sequence[bytes]) -> tuple[int, bytes] | None:
        # The topic frame is not checked again: the SUB filter matched it as a prefix, as ZMQ does.
        if len(frames) != 3 or len(frames[1]) != 8:
            self._stats.bad_messages += 1
            return None
        return int.from_bytes(frames[1], "big"), frames[2]

    def _decode(self, payload: bytes) -> KvBatch | None:
        try:
            return decode_kv_batch(payload)
        except ValueError as exc:
            self._stats.bad_messages += 1
            log.warning("KV events of %s: undecodable batch: %s", self.instance_id, exc)
            return None

    def _apply(self, batch: KvBatch | None, out: list[KvEvent], stamp: float) -> None:
        if batch is None:  # a lost batch: whatever it changed is unknown
            self._resync(out, "undecodable batch", stamp)
            return
        self._stats.batches += 1
        stored, removed = self.blocks.apply(batch)
        self._emit(out, "removed", removed, batch.ts)
        self._emit(out, "stored", stored, batch.ts)

    def _resync(self, out: list[KvEvent], why: str, stamp: float) -> None:
        self._stats.resyncs += 1
        log.warning("KV events of %s: resync, its cache is unknown (%s)", self.instance_id, why)
        self._emit(out, "removed", self.blocks.reset(), stamp)

    def _emit(
        self, out: list[KvEvent], kind: Literal["stored", "removed"], hashes: list[int], ts: float
    ) -> None:
        # Never earlier than what was reported before: the engine port's events are in ts order.
        ts = min(max(ts, self._last_ts), MAX_TS)
        self._last_ts = ts
        for start in range(0, len(hashes), MAX_BLOCK_HASHES):
            chunk = tuple(hashes[start : start + MAX_BLOCK_HASHES])
            out.append(
                KvEvent(instance_id=self.instance_id, model=self.model, kind=kind, block_hashes=chunk, ts=ts)
            )

    async def _replay(self, start: int, end: int) -> list[bytes] | None:
        """The payloads of batches ``start .. end - 1`` from the replay endpoint, or None."""
        if self.replay_endpoint is None or end - start > self.max_replay_batches:
            return None
        self._stats.replays += 1
        answer = _Replay()
        dealer = self._ctx().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.replay_endpoint)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")], flags=zmq.NOBLOCK)
            await asyncio.wait_for(self._read_replay(dealer, answer, start, end), self.replay_timeout_s)
        except (TimeoutError, zmq.ZMQError) as exc:
            log.info("KV replay from %s for %d..%d failed: %r", self.replay_endpoint, start, end - 1, exc)
        finally:
            # A fresh socket per replay: a late answer to this one can never be read as the next.
            dealer.close(linger=0)
        if not answer.complete or len(answer.payloads) != end - start:
            return None
        return [answer.payloads[seq] for seq in range(start, end)]

    async def _read_replay(self, dealer: zmq.asyncio.Socket, answer: _Replay, start: int, end: int) -> None:
        while True:
            frames = await dealer.recv_multipart()
            if len(frames) != 4 or frames[0] != b"":
                self._stats.bad_messages += 1
                continue
            if frames[2] == END_SEQ:
                answer.complete = True
                return
            if len(frames[2]) != 8:
                self._stats.bad_messages += 1
                continue
            seq = int.from_bytes(frames[2], "big")
            if start <= seq < end:
                answer.payloads[seq] = frames[3]
