"""The engine-side prefix KV cache: chained reuse, reference counts, LRU eviction, events."""

from __future__ import annotations

from sim.engine.kv_cache import PrefixKvCache


def invariant(cache: PrefixKvCache) -> None:
    assert cache.referenced >= 0 and cache.referenced + cache.evictable <= cache.capacity


def test_reuse_references_and_release_keeps_blocks_resident() -> None:
    cache = PrefixKvCache(10, record_events=True)
    assert cache.acquire([1, 2, 3], 4) == 0
    cache.commit([1, 2, 3])
    assert cache.events == [("stored", (1, 2, 3))]
    cache.release([1, 2, 3], 1)
    assert cache.referenced == 0 and cache.evictable == 3
    assert cache.acquire([1, 2, 9], 4) == 2  # the chain breaks at block 3
    assert cache.referenced == 4 and cache.evictable == 1
    invariant(cache)


def test_eviction_is_lru_and_tail_first() -> None:
    cache = PrefixKvCache(6, record_events=True)
    cache.acquire([1, 2, 3], 3)
    cache.commit([1, 2, 3])
    cache.release([1, 2, 3], 0)  # released tail first: 3 is the oldest evictable
    cache.acquire([], 4)  # needs 4 of 6: one block must go
    assert cache.events[-1] == ("removed", (3,))
    assert cache.match([1, 2, 3]) == 2
    invariant(cache)


def test_reservation_that_does_not_fit_changes_nothing() -> None:
    cache = PrefixKvCache(4)
    cache.acquire([1, 2], 3)
    cache.commit([1, 2])
    assert cache.acquire([1, 2, 5], 6) is None  # needs 4 more, only 1 free
    assert cache.referenced == 3 and cache.evictable == 0
    invariant(cache)


def test_duplicate_commit_shares_the_resident_block() -> None:
    cache = PrefixKvCache(10)
    cache.acquire([1, 2], 2)  # two requests prefill the same prompt concurrently
    cache.acquire([1, 2], 2)
    cache.commit([1, 2])
    cache.commit([1, 2])  # the second copy is freed, the first shared
    assert cache.referenced == 2
    cache.release([1, 2], 0)
    cache.release([1, 2], 0)
    assert cache.referenced == 0 and cache.evictable == 2
    invariant(cache)


def test_referenced_blocks_are_never_evicted() -> None:
    cache = PrefixKvCache(4)
    cache.acquire([1, 2], 2)
    cache.commit([1, 2])
    assert cache.acquire([], 3) is None  # 2 referenced + 3 > 4
    assert cache.match([1, 2]) == 2
