"""vLLM KV events: decoding real batches, and mapping them onto 512-token router blocks.

The batches are what a real vLLM 0.32 server (block size 32, 256 blocks) published for the
prompts in ``tests/fixtures/vllm/prompts.json`` (see its README): run 1 fills and overflows the
cache (evictions), run 2 is a restarted server with decoding, a prefix-cache reset and a new load.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import msgpack  # type: ignore[import-untyped]
import pytest

from agents.prompt_blocks import ROOT, block_hash, chained_block_hashes
from dispatcher.engines.vllm.kv_wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvBatch,
    decode_kv_batch,
)
from dispatcher.engines.vllm.router_blocks import RouterBlocks

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
PROMPTS: dict[str, dict[str, list[int]]] = json.loads((FIXTURES / "prompts.json").read_text())


def published(run: int) -> list[tuple[int, bytes]]:
    """(seq, payload) of every batch the server published in ``run``, in order."""
    out = []
    for line in (FIXTURES / "kv_events.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["source"] == "pub" and record["run"] == run:
            topic, seq, payload = (base64.b64decode(f) for f in record["frames_b64"])
            assert topic == b"kv"
            out.append((int.from_bytes(seq, "big"), payload))
    return out


def batch(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> KvBatch:
    return KvBatch(1.0, events)


def stored(hashes: list[int], parent: int | None, tokens: list[int], size: int = 32) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tuple(tokens), size, "GPU")


# --- decoding -------------------------------------------------------------------------------------


def test_a_real_prefill_batch() -> None:
    seq, payload = published(1)[0]
    decoded = decode_kv_batch(payload)
    assert seq == 0
    assert decoded.data_parallel_rank == 0 and decoded.ignored == 0
    assert 1.7e9 < decoded.ts < 1.9e9
    (event,) = decoded.events
    assert isinstance(event, BlockStored)
    # 1000 prompt tokens: 31 full blocks of 32 cached (the 32nd never fills with 8 output tokens).
    assert len(event.block_hashes) == 31 and event.parent_block_hash is None
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in event.block_hashes)
    assert event.token_ids == tuple(PROMPTS["run1"]["A"][:992])
    assert (event.block_size, event.medium, event.group_idx, event.keyed) == (32, "GPU", 0, False)


def test_a_real_batch_with_evictions_and_a_continuation() -> None:
    kinds = [type(e).__name__ for e in decode_kv_batch(published(1)[8][1]).events]
    assert kinds == ["BlockRemoved"] * 10 + ["BlockStored"]
    second = decode_kv_batch(published(1)[1][1]).events[0]
    first = decode_kv_batch(published(1)[0][1]).events[0]
    assert isinstance(first, BlockStored) and isinstance(second, BlockStored)
    # Prompt B shares A's first 600 tokens: vLLM reuses 18 blocks and stores the rest after them.
    assert second.parent_block_hash == first.block_hashes[17]
    assert second.token_ids == tuple(PROMPTS["run1"]["B"][576:1088])


def test_a_real_cache_reset() -> None:
    seq, payload = published(2)[31]
    events = decode_kv_batch(payload).events
    assert seq == 31 and isinstance(events[0], AllBlocksCleared) and isinstance(events[1], BlockStored)


def test_every_real_batch_decodes() -> None:
    for run in (1, 2):
        for _, payload in published(run):
            assert decode_kv_batch(payload).ignored == 0


def test_unknown_tags_are_ignored_and_old_array_events_read() -> None:
    payload = msgpack.packb(
        [
            5.0,
            [
                {"type": "BlockPinned", "block_hashes": [1]},
                ["BlockStored", [7, 8], None, list(range(64)), 32, None, "GPU"],
                ["BlockRemoved", [7], "GPU"],
                ["AllBlocksCleared"],
            ],
        ]
    )
    decoded = decode_kv_batch(payload)
    assert decoded.ignored == 1 and decoded.data_parallel_rank is None
    assert decoded.events == (
        BlockStored((7, 8), None, tuple(range(64)), 32, "GPU"),
        BlockRemoved((7,), "GPU"),
        AllBlocksCleared(),
    )


def test_bytes_hashes_and_keyed_blocks() -> None:
    event = {
        "type": "BlockStored",
        "block_hashes": [b"\x01" * 32],
        "parent_block_hash": b"\x02" * 32,
        "token_ids": list(range(16)),
        "block_size": 16,
        "extra_keys": [["salt"]],
    }
    (decoded,) = decode_kv_batch(msgpack.packb([1.0, [event], 0])).events
    assert isinstance(decoded, BlockStored)
    assert decoded.block_hashes == (b"\x01" * 32,) and decoded.parent_block_hash == b"\x02" * 32
    assert decoded.keyed


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        b"not msgpack at all",
        msgpack.packb({"ts": 1.0}),
        msgpack.packb([1.0]),
        msgpack.packb([float("nan"), []]),
        msgpack.packb([-1.0, []]),
        msgpack.packb([1.0, "events"]),
        msgpack.packb([1.0, [42]]),
        msgpack.packb([1.0, [{"type": 7}]]),
        msgpack.packb(
            [1.0, [{"type": "BlockStored", "block_hashes": ["x"], "token_ids": [], "block_size": 32}]]
        ),
        msgpack.packb(
            [1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [-1], "block_size": 1}]]
        ),
        msgpack.packb(
            [1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [1], "block_size": 0}]]
        ),
        msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": 5}]]),
    ],
)
def test_garbage_is_refused(payload: bytes) -> None:
    with pytest.raises(ValueError):
        decode_kv_batch(payload)


# --- router blocks from the real streams ----------------------------------------------------------


def replay_run(run: int) -> tuple[RouterBlocks, list[list[int]], list[list[int]]]:
    blocks = RouterBlocks()
    stored_per_batch, removed_per_batch = [], []
    for _, payload in published(run):
        stored_now, removed_now = blocks.apply(decode_kv_batch(payload))
        stored_per_batch.append(stored_now)
        removed_per_batch.append(removed_now)
    return blocks, stored_per_batch, removed_per_batch


def test_the_real_prefills_give_exactly_the_prompts_chained_hashes() -> None:
    blocks, stored_per_batch, _ = replay_run(1)
    # Run 1: twelve prompts of 1 000-1 100 tokens, 8 output tokens each: every full 512-token
    # block is prompt tokens only, so what the engine cached is exactly the prompts' blocks.
    expected = {h for prompt in PROMPTS["run1"].values() for h in chained_block_hashes(prompt)}
    assert {h for hashes in stored_per_batch for h in hashes} == expected
    assert stored_per_batch[0] == list(chained_block_hashes(PROMPTS["run1"]["A"]))
    # B shares only A's first 600 tokens: its second 512-block is new, its first is A's.
    assert stored_per_batch[1] == [chained_block_hashes(PROMPTS["run1"]["B"])[1]]
    assert blocks.skipped_blocks == 0 and blocks.ignored_events == 0


def test_a_router_block_goes_when_the_vllm_block_that_completed_it_is_evicted() -> None:
    blocks, _, removed_per_batch = replay_run(1)
    first = decode_kv_batch(published(1)[0][1]).events[0]
    assert isinstance(first, BlockStored)
    completing = first.block_hashes[15]  # tokens 480..511: the end of A's first 512-block
    for (_, payload), removed in zip(published(1), removed_per_batch, strict=True):
        gone = {
            h for e in decode_kv_batch(payload).events if isinstance(e, BlockRemoved) for h in e.block_hashes
        }
        assert (chained_block_hashes(PROMPTS["run1"]["A"])[0] in removed) == (completing in gone)
    assert any(removed_per_batch)
    # The state is bounded by the engine's cache: 256 blocks, one of them vLLM's null block.
    assert len(blocks) <= 255


def test_the_real_restarted_run_with_decoding_and_a_reset() -> None:
    blocks, stored_per_batch, removed_per_batch = replay_run(2)
    every_stored = {h for hashes in stored_per_batch for h in hashes}
    for prompt in PROMPTS["run2"].values():
        assert set(chained_block_hashes(prompt)) <= every_stored
    # vLLM's reset (seq 31) came with the next prefill: everything held before it went.
    held_before: set[int] = set()
    for hashes, gone in zip(stored_per_batch[:31], removed_per_batch[:31], strict=True):
        held_before = (held_before | set(hashes)) - set(gone)
    assert set(removed_per_batch[31]) == held_before
    assert stored_per_batch[31] == [chained_block_hashes(PROMPTS["run2"]["M0"])[0]]
    m_prompts = [PROMPTS["run2"][f"M{i}"] for i in range(5)]
    assert blocks.held == {chained_block_hashes(p)[0] for p in m_prompts}


# --- router blocks, one rule at a time ------------------------------------------------------------

TOKENS = list(range(1000, 2100))  # 1 100 tokens: two full 512-blocks
HASHES = list(range(1, 35))  # vLLM's hashes for its 34 full 32-token blocks


def test_blocks_stored_in_pieces_give_the_same_hashes() -> None:
    blocks = RouterBlocks()
    first, _ = blocks.apply(batch(stored(HASHES[:5], None, TOKENS[:160])))
    second, _ = blocks.apply(batch(stored(HASHES[5:20], HASHES[4], TOKENS[160:640])))
    third, _ = blocks.apply(batch(stored(HASHES[20:34], HASHES[19], TOKENS[640:1088])))
    assert (first, second, third) == (
        [],
        [chained_block_hashes(TOKENS)[0]],
        [chained_block_hashes(TOKENS)[1]],
    )
    assert len(blocks) == 34


def test_removal_and_clearing() -> None:
    blocks = RouterBlocks()
    blocks.apply(batch(stored(HASHES, None, TOKENS[:1088])))
    h0, h1 = chained_block_hashes(TOKENS)
    assert blocks.apply(batch(BlockRemoved((HASHES[3], HASHES[33]), "GPU"))) == ([], [])
    assert blocks.apply(batch(BlockRemoved((HASHES[31],), "GPU"))) == ([], [h1])
    assert blocks.apply(batch(AllBlocksCleared())) == ([], [h0])
    assert len(blocks) == 0 and blocks.held == frozenset()


def test_a_block_with_an_unknown_parent_is_skipped_and_counted() -> None:
    blocks = RouterBlocks()
    assert blocks.apply(batch(stored(HASHES[5:20], 999, TOKENS[160:640]))) == ([], [])
    assert blocks.skipped_blocks == 15 and len(blocks) == 0
    # What follows a skipped block is unknown too.
    assert blocks.apply(batch(stored(HASHES[20:22], HASHES[19], TOKENS[640:704]))) == ([], [])
    assert blocks.skipped_blocks == 17
    assert blocks.apply(batch(BlockRemoved((HASHES[7],), "GPU"))) == ([], [])
    assert blocks.unknown_removals == 1


def test_a_change_within_one_batch_is_reported_net() -> None:
    blocks = RouterBlocks()
    h0 = chained_block_hashes(TOKENS)[0]
    store = stored(HASHES[:16], None, TOKENS[:512])
    assert blocks.apply(batch(store, BlockRemoved((HASHES[15],), "GPU"))) == ([], [])
    blocks.apply(batch(store))
    assert blocks.apply(batch(BlockRemoved((HASHES[15],), "GPU"), store)) == ([], [])
    assert blocks.held == {h0}
    assert blocks.apply(batch(store)) == ([], [])  # re-reported blocks change nothing


def test_a_router_block_completed_twice_is_held_until_both_go() -> None:
    blocks = RouterBlocks()
    h0 = chained_block_hashes(TOKENS)[0]
    assert blocks.apply(batch(stored(HASHES[:16], None, TOKENS[:512]))) == ([h0], [])
    others = [100 + h for h in HASHES[:16]]  # same tokens, other vLLM hashes (e.g. another hash seed)
    assert blocks.apply(batch(stored(others, None, TOKENS[:512]))) == ([], [])
    assert blocks.apply(batch(BlockRemoved((HASHES[15],), "GPU"))) == ([], [])
    assert blocks.apply(batch(BlockRemoved((others[15],), "GPU"))) == ([], [h0])


def test_vllm_blocks_larger_than_a_router_block() -> None:
    blocks = RouterBlocks()
    tokens = list(range(3000))
    got, _ = blocks.apply(batch(stored([1, 2], None, tokens[:2048], size=1024)))
    assert got == list(chained_block_hashes(tokens[:2048]))
    assert got[0] == block_hash(ROOT, tokens[:512])


def test_keyed_other_group_and_other_medium_blocks_do_not_count() -> None:
    blocks = RouterBlocks()
    keyed = BlockStored(tuple(HASHES[:16]), None, tuple(TOKENS[:512]), 32, "GPU", keyed=True)
    other_group = BlockStored(tuple(HASHES[:16]), None, tuple(TOKENS[:512]), 32, "GPU", group_idx=1)
    on_cpu = BlockStored(tuple(HASHES[:16]), None, tuple(TOKENS[:512]), 32, "CPU")
    assert blocks.apply(batch(keyed, other_group, on_cpu)) == ([], [])
    assert (blocks.skipped_blocks, blocks.ignored_events, len(blocks)) == (16, 2, 0)


def test_reset_returns_what_was_held() -> None:
    blocks = RouterBlocks()
    blocks.apply(batch(stored(HASHES, None, TOKENS[:1088])))
    assert sorted(blocks.reset()) == sorted(chained_block_hashes(TOKENS))
    assert blocks.reset() == [] and len(blocks) == 0
