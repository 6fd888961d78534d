"""Routing policies on hand-built snapshots."""

from __future__ import annotations

from dataclasses import fields

from agents.policy.peers import DynamoKv, LlmdDefault, SglangCacheAware
from agents.policy.registry import INSTANCE_SELECTION
from agents.policy.types import BlocksChanged, ClusterView, Finished, RequestView
from tests.unit.policy.helpers import cluster_view, decide


def view(n: int, **columns: list[int]) -> ClusterView:
    return cluster_view(n, **columns)


def req(rid: str, tokens: int = 2048, blocks: tuple[int, ...] = (), model: str = "m") -> RequestView:
    return RequestView(rid, 1, "t", model, "interactive", tokens, 256, blocks, 1.0)


def test_policies_never_see_the_true_output_length() -> None:
    assert "output_tokens" not in {f.name for f in fields(RequestView)}
    assert {f.name for f in fields(RequestView)} >= {"output_budget", "block_hashes"}


def test_one_decision_per_request_in_order() -> None:
    v = view(4)
    for name in INSTANCE_SELECTION:
        requests = [req(f"r{k}") for k in range(5)]
        decisions = decide(INSTANCE_SELECTION[name](), requests, v, 1.0)
        assert [d.request.request_id for d in decisions] == [r.request_id for r in requests], name
        assert all(d.action == "admit" and 0 <= d.instance < 4 for d in decisions), name


def test_request_for_an_unserved_model_is_held_for_capacity() -> None:
    (decision,) = decide(INSTANCE_SELECTION["least-tokens"](), [req("x", model="other")], view(2), 1.0)
    assert decision.action == "queue" and decision.pool == "no_capacity" and "model" in decision.reason


def test_round_robin_cycles() -> None:
    policy = INSTANCE_SELECTION["round-robin"]()
    picks = [d.instance for d in decide(policy, [req(f"r{k}") for k in range(6)], view(3), 1.0)]
    assert picks == [0, 1, 2, 0, 1, 2]


def test_least_tokens_counts_what_it_sent_since_the_heartbeat() -> None:
    policy = INSTANCE_SELECTION["least-tokens"]()
    v = view(2, tokens=[1000, 1500])
    first, second = decide(policy, [req("a", tokens=2000), req("b", tokens=100)], v, 1.0)
    assert first.instance == 0  # 1000 < 1500
    assert second.instance == 1  # 1000 + 2000 > 1500


def test_least_request_uses_heartbeat_and_own_assignments() -> None:
    policy = INSTANCE_SELECTION["least-request"]()
    v = view(2, waiting=[3, 0], running=[1, 3])
    picks = [d.instance for d in decide(policy, [req(f"r{k}") for k in range(3)], v, 1.0)]
    assert picks[0] == 1 and picks[1] == 1 and picks[2] in (0, 1)


def test_sglang_follows_prefix_when_balanced_and_load_when_not() -> None:
    policy = SglangCacheAware(cache_threshold=0.5, balance_abs_threshold=2)
    v = view(2)
    blocks = tuple(range(8))
    (first,) = decide(policy, [req("a", 4096, blocks)], v, 1.0)
    (second,) = decide(policy, [req("b", 4096, blocks)], v, 1.0)
    assert second.instance == first.instance and second.reason == "prefix match"
    (third,) = decide(policy, [req("c", 4096, blocks)], v, 1.0)  # load gap 2: not > 2
    assert third.instance == first.instance
    # Load gap 3 > 2 (and 3 > 1.1 * 0): the next goes to the least-loaded instance.
    (fourth,) = decide(policy, [req("d", 4096, blocks)], v, 1.0)
    assert fourth.instance != first.instance and fourth.reason.startswith("imbalanced")


def test_dynamo_cost_is_uncached_prefill_plus_decode_blocks() -> None:
    policy = DynamoKv()
    policy.observe(BlocksChanged("i1", "stored", tuple(range(8)), 0.0))
    v = view(2)
    (d,) = decide(policy, [req("a", 4096, tuple(range(8)))], v, 1.0)
    assert d.instance == 1  # 0 blocks to prefill there vs 8
    # Its 8 blocks are now active on i1. With half of them evicted there, the same prompt costs
    # i1: prefill 8 - 4 overlap = 4, decode 8 active + 0 new = 12; i0: prefill 8, decode 0 + 8
    # new = 16 (the new request's own blocks count as decode blocks, as in Dynamo's selector).
    policy.observe(BlocksChanged("i1", "removed", tuple(range(4, 8)), 0.5))
    (e,) = decide(policy, [req("b", 4096, tuple(range(8)))], v, 1.0)
    assert e.instance == 1
    policy.observe(Finished("a", 1, "i1", "ok", 4096, 4096, 10, 0.1, 0.01, 2.0))
    assert policy.in_flight.blocks["i1"] == 8  # b still runs there; a has left


def test_llmd_weighs_queue_kv_and_prefix() -> None:
    policy = LlmdDefault()
    blocks = tuple(range(10))
    v = view(2, waiting=[0, 0], kv_used=[100, 100])
    (first,) = decide(policy, [req("a", 5120, blocks)], v, 1.0)
    # Same metrics: the prefix (weight 3) decides.
    (second,) = decide(policy, [req("b", 5120, blocks)], v, 1.0)
    assert second.instance == first.instance
    # The warm one now reports a long queue and a full cache: 3 * 1.0 < 2 * 1 + 2 * 0.9.
    busy = [0, 0]
    busy[first.instance] = 20
    kv = [100, 100]
    kv[first.instance] = 1000
    (third,) = decide(policy, [req("c", 5120, blocks)], view(2, waiting=busy, kv_used=kv), 1.0)
    assert third.instance != first.instance
