"""The router-side approximate prefix index."""

from __future__ import annotations

from agents.policy.prefix_index import PrefixIndex


def test_match_counts_leading_blocks_per_holder() -> None:
    index = PrefixIndex()
    index.add("a", [1, 2, 3, 4])
    index.add("b", [1, 2])
    index.add("c", [9, 2, 3])
    assert index.match([1, 2, 3, 5]) == {"a": 3, "b": 2}
    assert index.match([7, 1]) == {}


def test_lru_capacity_evicts_least_recent() -> None:
    index = PrefixIndex()
    index.set_capacity("a", 3)
    index.add("a", [1, 2, 3])
    index.add("a", [1])  # refresh 1
    index.add("a", [4])  # evicts 2, the least recent
    assert index.match([1, 2]) == {"a": 1}
    assert index.blocks_held("a") == 3


def test_removed_events_correct_the_index() -> None:
    index = PrefixIndex()
    index.add("a", [1, 2, 3])
    index.remove("a", [2, 42])  # unknown blocks are ignored
    assert index.match([1, 2, 3]) == {"a": 1}
    index.remove("nobody", [1])
    assert index.match([1]) == {"a": 1}
