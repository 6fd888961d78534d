"""The instance's KV cache in the engine's own block size (``EngineProfile.kv_block_tokens``):
prefix blocks stay 512 tokens, allocation follows the engine."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sim.engine.attempt import Attempt
from sim.engine.fleet import InstanceSpec
from sim.engine.instance import Instance
from sim.engine.kv_cache import PrefixKvCache
from sim.engine.profiles import load_profiles, profiles_text
from tests.unit.sim.helpers import LLAMA, request

pytestmark = pytest.mark.unit

KV_TOKENS = 16 * 512


def instance(block_tokens: int) -> Instance:
    profile = replace(LLAMA, name="tiny", kv_tokens=KV_TOKENS, kv_block_tokens=block_tokens)
    return Instance(InstanceSpec("i0", "dc-1", "llama3-8b", "1", profile), (0.0, 1e9), kv_events=False)


def user(name: str, first_block: int) -> Attempt:
    """A 2 100-token prompt of its own: 4 full 512-token prefix blocks and a 52-token tail."""
    blocks = list(range(first_block, first_block + 4))
    return Attempt(request(name, 0.0, 2100, 10, blocks), 1, 0.0, 64)


def drain(engine: Instance) -> None:
    while engine.scheduled:
        engine.finish_step(engine.step_end_s)


@pytest.mark.parametrize(("block_tokens", "kept"), [(512, 1), (32, 3)])
def test_smaller_engine_blocks_keep_more_of_another_users_prefix(block_tokens: int, kept: int) -> None:
    engine = instance(block_tokens)
    first = user("a", 100)
    engine.enqueue(first, 0.0)
    drain(engine)
    assert engine.cache.match(first.request.block_hashes) == 4
    others = [user(name, 100 * (k + 2)) for k, name in enumerate("bcd")]
    for attempt in others:
        engine.enqueue(attempt, engine.step_end_s)
    drain(engine)
    assert all(a.status == "ok" and a.preemptions == 0 for a in [first, *others])
    # Three running 2 110-token sequences hold 3 x 5 = 15 of 16 blocks of 512 tokens, but
    # 3 x 66 = 198 of 256 blocks of 32 tokens: the first user keeps 1 prefix block, or 3.
    assert engine.cache.match(first.request.block_hashes) == kept
    assert engine.cache.referenced == 0


def test_capacity_and_heartbeats_count_the_same_memory_in_either_unit() -> None:
    coarse, fine = instance(512), instance(32)
    assert (coarse.cache.capacity, fine.cache.capacity) == (16, 256)
    assert coarse.kv_blocks_total == fine.kv_blocks_total == 16  # heartbeats: 512-token blocks
    for engine in (coarse, fine):
        engine.enqueue(user("a", 100), 0.0)
        engine.finish_step(engine.step_end_s)  # the prompt is computed: 2 101 tokens held
    assert (coarse.cache.referenced, fine.cache.referenced) == (5, 66)
    assert coarse.heartbeat(coarse.step_start_s)[3] == 5
    assert fine.heartbeat(fine.step_start_s)[3] == 4  # round(66 / 16)
    assert not fine.fits_ever(Attempt(request("big", 0.0, KV_TOKENS, 10), 1, 0.0, 1))
    assert fine.fits_ever(Attempt(request("full", 0.0, KV_TOKENS - 32, 10), 1, 0.0, 32))


def test_a_keyed_block_takes_its_units() -> None:
    cache = PrefixKvCache(64, block_units=16)
    assert cache.acquire([1, 2], 40) == 0  # 2 prefix blocks (32 units) + 8 of tail
    cache.commit([1, 2])
    cache.release([1, 2], 8)
    assert (cache.referenced, cache.evictable) == (0, 32)
    assert cache.acquire([1, 9], 40) == 1  # reuses block 1, allocates 24 units
    assert (cache.referenced, cache.evictable, cache.free) == (40, 16, 24)
    assert cache.acquire([], 24) == 0  # fits only by evicting block 2
    assert not cache.resident(2) and cache.resident(1)
    assert cache.acquire([], 1) is None


def test_the_block_size_is_checked_and_round_trips_through_a_profiles_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kv_block_tokens must be a divisor of 512"):
        replace(LLAMA, kv_block_tokens=48)
    assert "kv_block_tokens" not in profiles_text({LLAMA.name: LLAMA}, {})
    path = tmp_path / "profiles.yaml"
    path.write_text(profiles_text({"tiny": replace(LLAMA, name="tiny", kv_block_tokens=32)}, {}))
    assert load_profiles(path).get("tiny").kv_block_tokens == 32
    path.write_text(path.read_text().replace("kv_block_tokens: 32", "kv_block_tokens: 100"))
    with pytest.raises(ValueError, match=r"profile 'tiny': kv_block_tokens must be a divisor of 512"):
        load_profiles(path)
