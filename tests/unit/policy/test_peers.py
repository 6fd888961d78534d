"""The peer routers against hand-computed cases from their sources' formulas."""

from __future__ import annotations

import numpy as np
import pytest

from agents.policy.common.selector import InstanceSelector
from agents.policy.peers import (
    DynamoKv,
    LlmdDefault,
    LlmdDefault4k,
    LlmdLoadAware,
    LlmdPrecise,
    SglangCacheAware,
    SmgEvents,
)
from agents.policy.types import BlocksChanged, ClusterView, Finished, FirstToken, Placed, RequestView
from tests.unit.policy.helpers import cluster_view, decide


def req(rid: str, tokens: int, blocks: tuple[int, ...] = ()) -> RequestView:
    return RequestView(rid, 1, "t", "m", "interactive", tokens, 256, blocks, 0.0)


def finished(rid: str, instance: str, time_s: float = 5.0) -> Finished:
    return Finished(rid, 1, instance, "ok", 0, 0, 1, 0.1, 0.01, time_s)


def first_token(rid: str, instance: str, time_s: float = 2.0) -> FirstToken:
    return FirstToken(rid, 1, instance, 0.5, time_s)


def place(policy: InstanceSelector, request: RequestView, v: ClusterView, now_s: float = 1.0) -> int:
    (outcome,) = decide(policy, [request], v, now_s)
    return outcome.instance


# --- dynamo-kv --------------------------------------------------------------------------------


def test_dynamo_costs_in_flight_prefill_overlap_and_deduplicated_active_blocks() -> None:
    policy = DynamoKv()
    v = cluster_view(2)
    policy.observe(BlocksChanged("i1", "stored", (10, 11, 12, 13), 0.0))
    a = req("a", 2048, (10, 11, 12, 13))
    # i0: (0 + 2048) / 512 - 0 = 4 prefill, 0 + 4 new blocks; i1: 4 - 4 = 0 prefill, 4 new blocks.
    assert policy.costs(a, v).tolist() == [8.0, 4.0]
    assert place(policy, a, v) == 1  # everything cached there: 0 uncached tokens in flight
    b = req("b", 1536, (20, 21, 22))
    # i0: 3 + (0 + 3); i1: 3 + (4 active + 3 new).
    assert policy.costs(b, v).tolist() == [6.0, 10.0]
    assert place(policy, b, v) == 0  # 1536 uncached tokens now in flight on i0
    c = req("c", 1536, (20, 21, 30))
    # i0: (1536 + 1536) / 512 = 6 prefill; 3 active + 1 new (20 and 21 already active there).
    # i1: 3 prefill; 4 active + 3 new.
    assert policy.costs(c, v).tolist() == [10.0, 10.0]
    policy.observe(first_token("b", "i0"))  # b's prefill is done: only its blocks stay
    assert policy.costs(c, v).tolist() == [7.0, 10.0]
    assert place(policy, c, v) == 0
    d = req("d", 512, (40,))
    # i0: (1536 in flight for c + 512) / 512 = 4 prefill; blocks {20, 21, 22, 30} = 4 (20 and
    # 21 are held by b and c but count once) + 1 new. i1: 1 prefill; 4 active + 1 new.
    assert policy.costs(d, v).tolist() == [9.0, 6.0]
    policy.observe(finished("b", "i0"))  # b's blocks leave; 20 and 21 stay for c
    assert policy.costs(d, v).tolist() == [8.0, 6.0]
    policy.observe(finished("c", "i0"))  # c ends before its first token: its prefill leaves too
    assert policy.costs(d, v).tolist() == [2.0, 6.0]


def test_dynamo_counts_prompt_tails_as_fractional_blocks() -> None:
    policy = DynamoKv()
    v = cluster_view(2)
    busy = place(policy, req("a", 640, (1,)), v)  # 1 block + a 128-token tail, nothing cached
    costs = policy.costs(req("x", 256), v)  # no full block: only its 0.5-block tail
    assert costs[1 - busy] == pytest.approx(0.5 + 0.5)
    # a's 640 uncached tokens are still in flight there, and its 1.25 blocks are active.
    assert costs[busy] == pytest.approx((640 + 256) / 512 + 1.25 + 0.5)


def test_dynamo_breaks_ties_at_random() -> None:
    v = cluster_view(2)
    picks = {place(DynamoKv(seed=s), req("a", 1024, (1, 2)), v) for s in range(30)}
    assert picks == {0, 1}


def test_dynamo_prefill_load_scale_weighs_only_the_prefill_term() -> None:
    policy = DynamoKv(prefill_load_scale=2.0)
    v = cluster_view(2)
    policy.observe(BlocksChanged("i0", "stored", (1, 2), 0.0))
    # i0: 2 * max(2 - 2, 0) + 2; i1: 2 * 2 + 2.
    assert policy.costs(req("a", 1024, (1, 2)), v).tolist() == [2.0, 6.0]


# --- sglang-cache-aware -----------------------------------------------------------------------


def loaded(policy: SglangCacheAware, loads: dict[str, int]) -> None:
    for instance, n in loads.items():
        for k in range(n):
            policy.in_flight.add(req(f"load-{instance}-{k}", 1), instance, 0.0)


def test_sglang_ships_current_defaults() -> None:
    policy = SglangCacheAware()
    assert (policy.cache_threshold, policy.balance_abs_threshold, policy.balance_rel_threshold) == (
        0.3,
        64,
        1.5,
    )
    assert policy.eviction_interval_s == 120.0
    assert policy.max_tree_tokens == 2**26 // 4
    assert policy.low_match == "smallest_tree"


@pytest.mark.parametrize(
    ("loads", "expected", "reason"),
    [
        ({"i0": 100, "i1": 35}, 1, "imbalanced: least loaded"),  # 65 > 64 and 100 > 52.5
        ({"i0": 100, "i1": 36}, 0, "prefix match"),  # 64 is not > 64
        ({"i0": 200, "i1": 135}, 0, "prefix match"),  # 65 > 64 but 200 < 1.5 * 135
    ],
)
def test_sglang_balances_only_beyond_both_thresholds(
    loads: dict[str, int], expected: int, reason: str
) -> None:
    policy = SglangCacheAware()
    v = cluster_view(2)
    policy.trees.insert("i0", (1, 2, 3, 4), 0, 0.0)
    loaded(policy, loads)
    (outcome,) = decide(policy, [req("a", 2048, (1, 2, 3, 4))], v, 1.0)
    assert (outcome.instance, outcome.reason) == (expected, reason)


@pytest.mark.parametrize(
    ("tokens", "expected", "reason"),
    [
        (1706, 0, "prefix match"),  # 512 / 1706 = 0.30012 > 0.3
        (1707, 1, "low match: smallest tree"),  # 512 / 1707 = 0.29994
    ],
)
def test_sglang_follows_the_match_above_the_cache_threshold(tokens: int, expected: int, reason: str) -> None:
    policy = SglangCacheAware()
    policy.trees.insert("i0", (1,), 0, 0.0)
    (outcome,) = decide(policy, [req("a", tokens, (1, 2, 3))], cluster_view(2), 1.0)
    assert (outcome.instance, outcome.reason) == (expected, reason)


def test_sglang_match_rate_equal_to_the_threshold_is_a_low_match() -> None:
    policy = SglangCacheAware()
    policy.trees.insert("i0", (1, 2, 3), 0, 0.0)
    (outcome,) = decide(policy, [req("a", 5120, tuple(range(1, 11)))], cluster_view(2), 1.0)  # 1536 / 5120
    assert (outcome.instance, outcome.reason) == (1, "low match: smallest tree")


def test_sglang_low_match_goes_to_the_smallest_tree_not_the_least_loaded() -> None:
    v = cluster_view(2)
    for low_match, expected in (("smallest_tree", 1), ("least_loaded", 0)):
        policy = SglangCacheAware(low_match=low_match)  # type: ignore[arg-type]
        policy.trees.insert("i0", (1, 2, 3), 100, 0.0)  # 3 * 512 + 100 tokens
        policy.trees.insert("i1", (7,), 0, 0.0)  # 512 tokens
        loaded(policy, {"i1": 5})  # balanced: 5 - 0 is not > 64
        assert place(policy, req("a", 1024, (50, 51)), v) == expected, low_match


def test_sglang_tree_sizes_count_blocks_and_tails() -> None:
    policy = SglangCacheAware()
    v = cluster_view(2)
    place(policy, req("a", 1300, (1, 2)), v)  # 2 blocks + a 276-token tail
    sizes = policy.trees.sizes(v).tolist()
    assert sorted(sizes) == [0, 1300]
    # Same prompt, same tree: only its new tail adds.
    row = sizes.index(1300)
    assert place(policy, req("b", 1300, (1, 2)), v) == row
    assert policy.trees.size_of(f"i{row}") == 1300 + 276


def test_sglang_evicts_least_recently_used_leaves_every_interval() -> None:
    policy = SglangCacheAware(max_tree_size_chars=4 * 1024)  # 1024 tokens = 2 blocks
    v = cluster_view(1)
    a, b = (1, 2), (3, 4)
    place(policy, req("a", 1024, a), v, 0.0)
    place(policy, req("b", 1024, b), v, 10.0)
    place(policy, req("c", 1024, b), v, 119.0)  # refreshes b's path; no eviction before 120 s
    assert policy.trees.size_of("i0") == 2048
    place(policy, req("d", 1024, b), v, 120.0)  # first eviction: a's leaf, then a's root
    assert policy.trees.size_of("i0") == 1024
    assert policy.trees.match_array(a, v).tolist() == [0]
    assert policy.trees.match_array(b, v).tolist() == [2]
    place(policy, req("e", 1024, a), v, 200.0)  # next eviction is at 240 s
    assert policy.trees.size_of("i0") == 2048
    place(policy, req("f", 1024, a), v, 240.0)  # b (last used at 120 s) goes now
    assert policy.trees.match_array(b, v).tolist() == [0]
    assert policy.trees.match_array(a, v).tolist() == [2]


def test_sglang_a_prefix_match_refreshes_the_matched_path() -> None:
    policy = SglangCacheAware(max_tree_size_chars=4 * 512)  # 1 block
    v = cluster_view(2)
    policy.trees.insert("i0", (1,), 0, 0.0)
    policy.trees.insert("i0", (5,), 0, 50.0)
    # A low match (512 / 5120) on i0 refreshes block 1 at t=100, then goes to the empty i1.
    assert place(policy, req("a", 5120, (1, 90, 91, 92)), v, 100.0) == 1
    policy.trees.evict(policy.max_tree_tokens)  # i0's least recently used leaf is now 5
    assert policy.trees.match_array((1,), v)[0] == 1
    assert policy.trees.match_array((5,), v)[0] == 0


# --- llm-d-default ----------------------------------------------------------------------------


def test_llmd_4k_variant_prefix_score_covers_only_the_first_4096_tokens() -> None:
    policy = LlmdDefault4k()
    v = cluster_view(2)
    long_prompt = tuple(range(20))  # 10240 tokens
    row = place(policy, req("a", 10240, long_prompt), v)
    assert policy.index.blocks_held(f"i{row}") == 8  # llm-d indexed at most 256 x 16 tokens
    same_start = tuple(range(8)) + tuple(range(100, 112))
    expected = [0.0, 0.0]
    expected[row] = 1.0  # 256 of 256 llm-d blocks: indistinguishable from the full match
    assert policy.prefix_scores(req("b", 10240, long_prompt), v).tolist() == expected
    assert policy.prefix_scores(req("c", 10240, same_start), v).tolist() == expected
    # 1000 tokens: ceil(1000 / 16) = 63 llm-d blocks; one matched 512-token block is 32 of them.
    assert policy.prefix_scores(req("d", 1000, (0,)), v)[row] == pytest.approx(32 / 63)
    # Shorter than one llm-d block: only a partial block is hashed, never matched, score 0.
    assert policy.prefix_scores(req("e", 15, ()), v).tolist() == [0.0, 0.0]


def test_llmd_default_matches_up_to_131072_tokens_in_64_token_blocks() -> None:
    policy = LlmdDefault()
    v = cluster_view(2)
    long_prompt = tuple(range(20))  # 10240 tokens: all hashed now (cap 131072)
    row = place(policy, req("a", 10240, long_prompt), v)
    assert policy.index.blocks_held(f"i{row}") == 20
    same_start = tuple(range(8)) + tuple(range(100, 112))
    full, partial = [0.0, 0.0], [0.0, 0.0]
    full[row] = 1.0  # 160 of 10240 / 64 = 160 blocks
    partial[row] = 64 / 160  # 8 of ours = 8 x 8 = 64 blocks of 64 tokens
    assert policy.prefix_scores(req("b", 10240, long_prompt), v).tolist() == full
    assert policy.prefix_scores(req("c", 10240, same_start), v).tolist() == pytest.approx(partial)
    # 1000 tokens: ceil(1000 / 64) = 16 blocks (the partial one hashed); one of ours is 8.
    assert policy.prefix_scores(req("d", 1000, (0,)), v)[row] == pytest.approx(8 / 16)
    assert policy.prefix_scores(req("e", 63, ()), v).tolist() == [0.0, 0.0]
    # 200 000 tokens: only the first 131072 / 64 = 2048 blocks (our first 256) are hashed.
    fresh, huge = LlmdDefault(), tuple(range(1000, 1390))  # 390 full blocks of ours
    row = place(fresh, req("f", 200_000, huge), v)
    assert fresh.index.blocks_held(f"i{row}") == 256
    assert fresh.prefix_scores(req("g", 200_000, (*huge[:256], 7)), v)[row] == 1.0


def test_llmd_default_lru_holds_num_gpu_blocks_entries_of_64_tokens() -> None:
    # kv_total 2 of our blocks = 1024 tokens = 64 engine blocks of 16 tokens -> 64 LRU entries
    # of 64 tokens = 4096 tokens = 8 of our blocks (4x the pod's KV); 16-token entries: 2.
    new, old = LlmdDefault(), LlmdDefault4k()
    v = cluster_view(1, kv_total=2)
    for policy in (new, old):
        place(policy, req("a", 6144, tuple(range(12))), v)
    assert new.index.blocks_held("i0") == 8
    assert old.index.blocks_held("i0") == 2


def test_llmd_scores_queue_kv_and_prefix_with_weights_2_2_3() -> None:
    policy = LlmdDefault()
    v = cluster_view(3, waiting=[0, 4, 8], kv_used=[500, 0, 250])
    place(policy, req("a", 2048, (1, 2, 3, 4)), cluster_view(3, waiting=[9, 9, 0]))  # warms i2
    mask = np.ones(3, dtype=bool)
    scores = policy.scores(req("b", 4096, (1, 2, 5, 6, 7, 8, 9, 10)), v, mask)
    # queue (8 - q) / 8: 1, 0.5, 0; kv 1 - used / total: 0.5, 1, 0.75; prefix on i2: 2 of our
    # blocks = 16 of llm-d's 64-token blocks, of 4096 / 64 = 64.
    assert scores.tolist() == pytest.approx([2 * 1 + 2 * 0.5, 2 * 0.5 + 2 * 1, 2 * 0.75 + 3 * 0.25])
    assert place(policy, req("c", 4096, (1, 2, 5, 6, 7, 8, 9, 10)), v) in (0, 1)  # 3.0 tie


def test_llmd_idle_fleet_herds_onto_holders_of_a_shared_first_block() -> None:
    # Faithful, not a bug (docs/results/scoreboard.md, low load): on an idle fleet every queue
    # is equal (queue-scorer's neutral 1 for all) and KV use is 0 everywhere, so only the prefix
    # term differs; a first block every prompt shares (Mooncake's hash id 0) scores > 0 on every
    # instance that has served anything, so a burst never reaches the cold instances.
    policy = LlmdDefault(seed=1)
    idle = cluster_view(8)
    first = place(policy, req("r0", 7168, (0, 1, 2)), idle)
    rows = {place(policy, req(f"r{k}", 7168, (0, 100 + 2 * k, 101 + 2 * k)), idle) for k in range(1, 30)}
    assert rows == {first}
    scores = policy.scores(req("x", 7168, (0, 9, 10)), idle, np.ones(8, dtype=bool))
    # 2 * 1 (queue) + 2 * 1 (kv) everywhere, + 3 * 8 / 112 on the holder of block 0.
    expected = np.full(8, 4.0)
    expected[first] += 3 * 8 / 112
    assert scores.tolist() == pytest.approx(expected.tolist())


def test_llmd_load_aware_variant_scores_prefix_plus_load() -> None:
    policy = LlmdLoadAware()
    v = cluster_view(3, waiting=[0, 64, 200])
    scores = policy.scores(req("a", 1024, (1, 2)), v, np.ones(3, dtype=bool))
    assert scores.tolist() == pytest.approx([0.5, 0.25, 0.0])


# --- llm-d-precise ----------------------------------------------------------------------------


def test_llmd_precise_scores_event_prefix_kv_and_queue_with_weights_2_1_1() -> None:
    policy = LlmdPrecise()
    v = cluster_view(3, waiting=[0, 2, 4], kv_used=[0, 500, 250])
    policy.observe(BlocksChanged("i1", "stored", (1, 2, 3, 4), 0.0))
    policy.observe(BlocksChanged("i2", "stored", (1, 2), 0.0))
    a = req("a", 2100, (1, 2, 3, 4))
    # total = 2100 // 64 = 32 full blocks; i1 holds 4 x 8 = 32, i2 16: prefix 0, 1, 0.5.
    assert policy.prefix_scores(a, v).tolist() == [0.0, 1.0, 0.5]
    # queue (4 - q) / 4: 1, 0.5, 0; kv: 1, 0.5, 0.75.
    assert policy.scores(a, v, np.ones(3, dtype=bool)).tolist() == pytest.approx([2.0, 3.0, 1.75])
    assert place(policy, a, v) == 1
    policy.observe(BlocksChanged("i1", "removed", (3, 4), 1.0))  # the engine evicted them
    assert policy.scores(a, v, np.ones(3, dtype=bool)).tolist() == pytest.approx([2.0, 2.0, 1.75])
    # Its own routing adds nothing (speculative indexing ships off): i0 stays at prefix 0.
    place(policy, req("b", 2100, (1, 2, 3, 4)), cluster_view(3, waiting=[0, 9, 9]))
    assert policy.prefix_scores(a, v)[0] == 0.0
    # Fewer than 64 tokens: no full block, no key, prefix 0.
    assert policy.prefix_scores(req("c", 63, ()), v).tolist() == [0.0, 0.0, 0.0]
    assert policy.wants_kv_events and not policy.shares_placements


# --- smg-events -------------------------------------------------------------------------------


def test_smg_events_highest_overlap_then_lower_load_then_smaller_tree() -> None:
    policy = SmgEvents()
    assert (policy.balance_abs_threshold, policy.balance_rel_threshold) == (64, 1.5)
    v = cluster_view(3)
    policy.observe(BlocksChanged("i0", "stored", (1, 2), 0.0))
    policy.observe(BlocksChanged("i1", "stored", (1, 2, 3), 0.0))
    policy.observe(BlocksChanged("i2", "stored", (1, 2, 3, 9), 0.0))
    a = req("a", 2048, (1, 2, 3, 4))
    # Overlap 2, 3, 3; loads 0: the smaller tree of i1 (3 blocks) beats i2 (4).
    assert place(policy, a, v) == 1
    # i1 now has 1 request in flight, i2 none: the lower load wins.
    assert place(policy, req("b", 2048, (1, 2, 3, 4)), v) == 2
    # Loads 1 and 1 again: the smaller tree.
    assert place(policy, req("c", 2048, (1, 2, 3, 4)), v) == 1
    # A longer overlap wins whatever the load: i2 holds 4 of 4.
    assert place(policy, req("d", 2048, (1, 2, 3, 9)), v) == 2


def test_smg_events_exact_tie_goes_to_the_last_row_and_no_overlap_to_the_least_loaded() -> None:
    policy = SmgEvents()
    v = cluster_view(3)
    for instance in ("i0", "i1"):
        policy.observe(BlocksChanged(instance, "stored", (5,), 0.0))
    assert place(policy, req("a", 1024, (5, 6)), v) == 1  # (1, 0, 1) on both: max_by_key keeps the last
    # No overlap: min (load, processed, row): i0 and i2 both idle and never chosen -> i0.
    assert place(policy, req("b", 1024, (70, 71)), v) == 0
    policy.observe(finished("a", "i1"))
    policy.observe(finished("b", "i0"))
    # All idle again; processed i0 = 1, i1 = 1, i2 = 0 -> i2.
    assert place(policy, req("c", 1024, (80,)), v) == 2
    # Shorter than one block: no overlap either.
    assert place(policy, req("d", 100, ()), v) in (0, 1)


def test_smg_events_imbalance_routes_to_the_least_loaded() -> None:
    policy = SmgEvents(balance_abs_threshold=1)
    v = cluster_view(3)
    policy.observe(BlocksChanged("i0", "stored", (1,), 0.0))
    assert place(policy, req("a", 512, (1,)), v) == 0  # loads 0, 0, 0: overlap
    assert place(policy, req("b", 512, (1,)), v) == 0  # loads 1, 0, 0: 1 - 0 is not > 1
    # loads 2, 0, 0: 2 - 0 > 1 and 2 > 1.5 * 0: imbalanced, least loaded (row order on ties).
    (c,) = decide(policy, [req("c", 512, (1,))], v, 1.0)
    assert (c.instance, c.reason) == (1, "imbalanced: least loaded")
    assert place(policy, req("d", 512, (1,)), v) == 2  # loads 2, 1, 0


# --- several deciders per pool: another replica's placement ---------------------------------


def test_dynamo_with_replica_sync_counts_another_replicas_request_as_its_own() -> None:
    mine, synced = DynamoKv(), DynamoKv()
    v = cluster_view(2)
    for policy in (mine, synced):
        policy.observe(BlocksChanged("i1", "stored", (10, 11), 0.0))
    a = req("a", 2048, (10, 11, 12, 13))
    assert place(mine, a, v) == 1
    synced.observe(Placed(a, "i1", 1.0))  # a peer replica's AddRequest
    probe = req("p", 1024, (20, 21))
    assert synced.costs(probe, v).tolist() == mine.costs(probe, v).tolist() == [4.0, 10.0]
    for policy in (mine, synced):
        policy.observe(first_token("a", "i1"))  # MarkPrefillCompleted
    assert synced.costs(probe, v).tolist() == mine.costs(probe, v).tolist() == [4.0, 8.0]
    for policy in (mine, synced):
        policy.observe(finished("a", "i1"))  # Free
    assert synced.costs(probe, v).tolist() == mine.costs(probe, v).tolist() == [4.0, 4.0]


def test_dynamo_without_replica_sync_ignores_another_replicas_request() -> None:
    policy = DynamoKv(router_replica_sync=False)
    v = cluster_view(2)
    policy.observe(Placed(req("a", 2048, (10, 11, 12, 13)), "i1", 1.0))
    assert policy.costs(req("p", 1024, (20, 21)), v).tolist() == [4.0, 4.0]
    assert policy.in_flight.requests == {}


def test_sglang_llmd_and_smg_replicas_share_nothing() -> None:
    v = cluster_view(2)
    a = req("a", 2048, (1, 2, 3, 4))
    sglang, llmd = SglangCacheAware(), LlmdDefault()
    for policy in (sglang, llmd, LlmdPrecise(), SmgEvents()):
        policy.observe(Placed(a, "i1", 1.0))
        assert policy.in_flight.requests == {}
    assert sglang.trees.sizes(v).tolist() == [0, 0]
    assert llmd.prefix_scores(a, v).tolist() == [0.0, 0.0]
