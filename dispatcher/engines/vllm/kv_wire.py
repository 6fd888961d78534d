"""vLLM's KV-cache event batches, decoded (pure: msgpack in, small dataclasses out).

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

``router_blocks.RouterBlocks`` maps the decoded blocks onto TokenFleet's prefix blocks;
``kv_events.KvEventSubscriber`` reads them off the engine's sockets.
"""

from __future__ import annotations

import array
import math
from dataclasses import dataclass
from typing import Any, TypeGuard

import msgpack

VllmBlockHash = int | bytes
"""A vLLM block hash as published: an int (default) or bytes. Opaque: only compared."""

_MAX_TOKEN = 2**32 - 1
assert array.array("I").itemsize == 4, "token ids are packed as 4-byte unsigned ints"


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
