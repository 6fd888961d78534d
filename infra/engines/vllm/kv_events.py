"""vLLM's KV-cache events (ZMQ) turned into TokenFleet ``KvEvent``s on 512-token prefix blocks.

Wire format (vLLM 0.32, ``vllm/distributed/kv_events.py``), as captured from a real server
(``tests/fixtures/vllm/``):

- the publisher's PUB socket sends, per engine step with cache changes, the multipart message
  ``[topic, seq, payload]``: ``seq`` is 8 bytes big-endian, counting from 0 at server start;
  ``payload`` is msgpack ``[ts, [event, ...], data_parallel_rank]`` (an array);
- each event is a msgpack *map* tagged by ``"type"`` (msgspec ``tag=True``, not array-like):
  ``{"type": "BlockStored", "block_hashes": [...], "parent_block_hash": h | None,
  "token_ids": [...], "block_size": 32, "lora_id": None, "medium": "GPU", "lora_name": None,
  "extra_keys": [None, ...], "group_idx": 0, "kv_cache_spec_kind": "full_attention"}``,
  ``{"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0}``,
  ``{"type": "AllBlocksCleared"}``; fields equal to their default are left out. Older vLLMs
  sent array-like events (``["BlockStored", block_hashes, parent, token_ids, block_size, ...]``):
  read too.
- block hashes are unsigned 64-bit ints by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``:
  the low 64 bits of the SHA-256 block hash) or raw bytes: kept as opaque values here;
- the replay endpoint is a ROUTER: a DEALER sends ``[b"", start_seq]`` (8 bytes big-endian) and
  receives ``[b"", topic, seq, payload]`` for every buffered batch with ``seq >= start_seq``
  (the last 10 000 batches by default), then the end marker ``[b"", b"", -1 (8 bytes, signed
  big-endian), b""]``. Events are published at the engine step after the change, so one batch
  may mix causes (a cache reset and the next request's prefill).

Three parts: ``decode_kv_batch`` (pure), ``RouterBlocks`` (pure mapping onto TokenFleet's block
hashes, one per engine), ``KvEventSubscriber`` (asyncio ZMQ, gaps, replay, resync).
"""

from __future__ import annotations

import array
import asyncio
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeGuard

import msgpack
import zmq
import zmq.asyncio

from agents.policy.types import BLOCK_TOKENS
from agents.prompt_blocks import ROOT, block_hash
from schemas.events import MAX_BLOCK_HASHES, MAX_TS, KvEvent

log = logging.getLogger(__name__)

VllmBlockHash = int | bytes
"""A vLLM block hash as published: an int (default) or bytes. Opaque: only compared."""

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay endpoint's end-of-answer marker, in the seq frame."""

_MAX_TOKEN = 2**32 - 1
assert array.array("I").itemsize == 4, "token ids are packed as 4-byte unsigned ints"


# --- decoding -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BlockStored:
    """vLLM cached ``len(block_hashes)`` full blocks of ``block_size`` tokens, ``token_ids`` in
    order; the first one's parent is ``parent_block_hash`` (None: it starts the sequence).
    ``keyed``: a LoRA adapter or extra keys (multimodal inputs, cache salt) entered vLLM's hash,
    so only requests with the same keys can reuse the blocks."""

    block_hashes: tuple[VllmBlockHash, ...]
    parent_block_hash: VllmBlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    group_idx: int = 0
    keyed: bool = False


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """vLLM evicted these blocks (their hashes no longer hit)."""

    block_hashes: tuple[VllmBlockHash, ...]
    medium: str | None = None
    group_idx: int = 0


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """vLLM dropped its whole prefix cache (a reset)."""


KvCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KvBatch:
    """One published batch: ``ts`` (the engine's wall clock, seconds since the epoch), its events
    in order, the data-parallel rank, and how many events had a tag we do not know (ignored)."""

    ts: float
    events: tuple[KvCacheEvent, ...]
    data_parallel_rank: int | None = None
    ignored: int = 0


def decode_kv_batch(payload: bytes) -> KvBatch:
    """The batch in one payload frame. Raises ``ValueError`` (one line) on anything that is not
    a well-formed batch; events with an unknown ``type`` are skipped and counted."""
    try:
        raw = msgpack.unpackb(payload, raw=False, use_list=True)
    except Exception as exc:  # msgpack raises several types (ExtraData, FormatError, ValueError, ...)
        raise ValueError(f"not msgpack: {type(exc).__name__}") from None
    if not isinstance(raw, list) or not 2 <= len(raw) <= 3:
        raise ValueError("a batch is an array [ts, events, data_parallel_rank]")
    ts, items = raw[0], raw[1]
    rank = raw[2] if len(raw) == 3 else None
    if not _is_number(ts) or not math.isfinite(ts) or ts < 0:
        raise ValueError(f"bad batch ts {ts!r}")
    if not isinstance(items, list):
        raise ValueError("the batch's events are not an array")
    if rank is not None and not _is_int(rank):
        raise ValueError(f"bad data_parallel_rank {rank!r}")
    events: list[KvCacheEvent] = []
    ignored = 0
    for item in items:
        event = _decode_event(item)
        if event is None:
            ignored += 1
        else:
            events.append(event)
    return KvBatch(float(ts), tuple(events), rank, ignored)


# Field order of the array-like encoding (msgspec puts the tag first, then the fields in order).
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
_REMOVED_FIELDS = ("block_hashes", "medium")


def _decode_event(item: Any) -> KvCacheEvent | None:
    if isinstance(item, dict):
        tag, fields = item.get("type"), item
    elif isinstance(item, list) and item:
        tag = item[0]
        names = _STORED_FIELDS if tag == "BlockStored" else _REMOVED_FIELDS
        fields = dict(zip(names, item[1:], strict=False))
    else:
        raise ValueError(f"an event is a tagged map or array, got {type(item).__name__}")
    if tag == "BlockStored":
        return _stored(fields)
    if tag == "BlockRemoved":
        return BlockRemoved(_hashes(fields.get("block_hashes")), _medium(fields), _group(fields))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if not isinstance(tag, str):
        raise ValueError(f"an event's tag is not a string: {tag!r}")
    return None


def _stored(fields: dict[str, Any]) -> BlockStored:
    hashes = _hashes(fields.get("block_hashes"))
    parent = fields.get("parent_block_hash")
    if parent is not None and not _is_hash(parent):
        raise ValueError(f"bad parent_block_hash {parent!r}")
    tokens = fields.get("token_ids")
    if not isinstance(tokens, list) or not all(_is_int(t) and 0 <= t <= _MAX_TOKEN for t in tokens):
        raise ValueError("token_ids must be an array of 32-bit unsigned ints")
    size = fields.get("block_size")
    if not _is_int(size) or size < 1:
        raise ValueError(f"bad block_size {size!r}")
    extra = fields.get("extra_keys")
    keyed = (
        fields.get("lora_id") is not None
        or fields.get("lora_name") is not None
        or (isinstance(extra, list) and any(key is not None for key in extra))
    )
    return BlockStored(hashes, parent, tuple(tokens), size, _medium(fields), _group(fields), keyed)


def _hashes(value: Any) -> tuple[VllmBlockHash, ...]:
    if not isinstance(value, list) or not all(_is_hash(h) for h in value):
        raise ValueError("block_hashes must be an array of ints or bytes")
    return tuple(value)


def _medium(fields: dict[str, Any]) -> str | None:
    medium = fields.get("medium")
    if medium is not None and not isinstance(medium, str):
        raise ValueError(f"bad medium {medium!r}")
    return medium


def _group(fields: dict[str, Any]) -> int:
    group = fields.get("group_idx")
    if group is None:
        return 0
    if not _is_int(group):
        raise ValueError(f"bad group_idx {group!r}")
    return int(group)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_hash(value: object) -> TypeGuard[VllmBlockHash]:
    return _is_int(value) or isinstance(value, bytes)


# --- mapping onto 512-token router blocks ---------------------------------------------------------


class _Node:
    """Where one cached vLLM block ends in its token sequence.

    ``last``: the router hash of the last complete window ending at or before this block's end
    (``ROOT`` before the first); ``pending``: tokens since that boundary (< ``block_tokens``);
    ``tokens``: this block's own share of them; ``prev``: the node holding the share before
    (None when this block's share starts the window); ``completed``: the router hashes of the
    windows this block completed.
    """

    __slots__ = ("completed", "last", "pending", "prev", "tokens")

    def __init__(
        self,
        last: int,
        pending: int,
        tokens: array.array[int],
        prev: _Node | None,
        completed: tuple[int, ...],
    ) -> None:
        self.last = last
        self.pending = pending
        self.tokens = tokens
        self.prev = prev
        self.completed = completed


_START = _Node(ROOT, 0, array.array("I"), None, ())


class RouterBlocks:
    """One engine's cached vLLM blocks, mapped onto TokenFleet's 512-token prefix blocks.

    A router block hash is ``agents.prompt_blocks.block_hash`` chained from ``ROOT`` over the
    token ids: ``r_j = H(r_{j-1}, t[512 j : 512 (j+1)])``, so the hashes an engine's events give
    equal ``chained_block_hashes(prompt_token_ids)`` that the scheduler computes for a request.

    Each stored vLLM block (``block_size`` tokens, e.g. 32) becomes a node placed after its parent
    (``parent_block_hash``; None = the start of a sequence): with ``p`` tokens pending since the
    parent's last window boundary, a block of ``k`` tokens completes the window when
    ``p + k >= 512``, and its router hash is ``H(last, pending tokens + the block's first
    512 - p)`` (several windows if ``k > 512``). A router block is *held* while at least one
    vLLM block that completed it is cached (a count per router hash); ``apply`` reports the
    changes of one batch as net sets (stored = became held, removed = stopped being held).

    Approximations, all towards "not held" or "held slightly too long":
    - a router block is held while the vLLM block that *completed* it is, although vLLM may have
      evicted earlier blocks of the same window (eviction goes tail first, so rarely);
    - blocks whose parent is unknown (events missed, or the parent was skipped) are skipped and
      counted in ``skipped_blocks``: whatever follows them is invisible until a resync;
    - keyed blocks (LoRA, multimodal, cache salt: ``BlockStored.keyed``) are skipped too: a
      plain request with the same tokens cannot reuse them;
    - only one KV-cache group (``group_idx``, 0: full attention in a plain decoder) and the media
      in ``mediums`` count; other events are ignored (``ignored_events``).

    State: one node per cached vLLM block in the group (deleted on ``BlockRemoved``; a removed
    node stays alive only while a later node of the same open window refers to it), so it is
    bounded by the engine's cache.
    """

    def __init__(
        self,
        block_tokens: int = BLOCK_TOKENS,
        group_idx: int = 0,
        mediums: Iterable[str | None] = (None, "GPU"),
    ) -> None:
        self.block_tokens = block_tokens
        self.group_idx = group_idx
        self.mediums = frozenset(mediums)
        self._nodes: dict[VllmBlockHash, _Node] = {}
        self._held: dict[int, int] = {}
        self.skipped_blocks = 0
        self.ignored_events = 0
        self.unknown_removals = 0

    def __len__(self) -> int:
        """vLLM blocks tracked."""
        return len(self._nodes)

    @property
    def held(self) -> frozenset[int]:
        """The router hashes this engine holds now."""
        return frozenset(self._held)

    def apply(self, batch: KvBatch) -> tuple[list[int], list[int]]:
        """Apply one batch; return (stored, removed) router hashes: the net change (disjoint,
        first-touched order)."""
        before: dict[int, bool] = {}
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                for router in self._held:
                    before.setdefault(router, True)
                self._nodes.clear()
                self._held.clear()
            elif event.group_idx != self.group_idx or event.medium not in self.mediums:
                self.ignored_events += 1
            elif isinstance(event, BlockStored):
                self._store(event, before)
            else:
                self._remove(event.block_hashes, before)
        stored = [r for r, was in before.items() if not was and r in self._held]
        removed = [r for r, was in before.items() if was and r not in self._held]
        return stored, removed

    def reset(self) -> list[int]:
        """Forget everything; return the router hashes that were held (now to be removed)."""
        held = list(self._held)
        self._nodes.clear()
        self._held.clear()
        return held

    def _store(self, event: BlockStored, before: dict[int, bool]) -> None:
        count, size = len(event.block_hashes), event.block_size
        if len(event.token_ids) != count * size:
            # Some blocks were masked out (sparse attention): we cannot tell which tokens are whose.
            self.skipped_blocks += count
            return
        if event.keyed:
            self.skipped_blocks += count
            return
        if event.parent_block_hash is None:
            parent: _Node | None = _START
        else:
            parent = self._nodes.get(event.parent_block_hash)
        for index, vllm_hash in enumerate(event.block_hashes):
            known = self._nodes.get(vllm_hash)
            if known is not None:  # re-reported (vLLM's "full" report mode): nothing changes
                parent = known
                continue
            if parent is None:
                self.skipped_blocks += 1
                continue
            node = self._place(parent, event.token_ids[index * size : (index + 1) * size])
            self._nodes[vllm_hash] = node
            for router in node.completed:
                before.setdefault(router, router in self._held)
                self._held[router] = self._held.get(router, 0) + 1
            parent = node

    def _place(self, parent: _Node, tokens: Sequence[int]) -> _Node:
        need = self.block_tokens - parent.pending
        if len(tokens) < need:
            own = array.array("I", tokens)
            return _Node(
                parent.last, parent.pending + len(tokens), own, parent if parent.pending else None, ()
            )
        window = self._open_tokens(parent)
        window.extend(tokens[:need])
        last = block_hash(parent.last, window)
        completed = [last]
        rest = need
        while len(tokens) - rest >= self.block_tokens:
            last = block_hash(last, tokens[rest : rest + self.block_tokens])
            completed.append(last)
            rest += self.block_tokens
        own = array.array("I", tokens[rest:])
        return _Node(last, len(own), own, None, tuple(completed))

    @staticmethod
    def _open_tokens(node: _Node) -> array.array[int]:
        """The tokens since ``node``'s last window boundary, in order."""
        shares: list[array.array[int]] = []
        walk: _Node | None = node
        while walk is not None and walk.pending:
            shares.append(walk.tokens)
            walk = walk.prev
        window = array.array("I")
        for share in reversed(shares):
            window.extend(share)
        return window

    def _remove(self, hashes: Sequence[VllmBlockHash], before: dict[int, bool]) -> None:
        for vllm_hash in hashes:
            node = self._nodes.pop(vllm_hash, None)
            if node is None:
                self.unknown_removals += 1
                continue
            for router in node.completed:
                before.setdefault(router, True)
                left = self._held[router] - 1
                if left:
                    self._held[router] = left
                else:
                    del self._held[router]


# --- the subscriber -------------------------------------------------------------------------------


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
