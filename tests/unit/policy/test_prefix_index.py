"""The router-side approximate prefix index."""

from __future__ import annotations

import random
from collections import OrderedDict

import numpy as np

from agents.policy.common import prefix_kernels
from agents.policy.common.prefix_index import EPOCHS_PER_CAPACITY, PrefixIndex, sorted_distinct
from tests.unit.policy.helpers import cluster_view


def test_match_counts_leading_blocks_per_holder() -> None:
    index = PrefixIndex()
    index.add("a", [1, 2, 3, 4])
    index.add("b", [1, 2])
    index.add("c", [9, 2, 3])
    assert index.match([1, 2, 3, 5]) == {"a": 3, "b": 2}
    assert index.match([7, 1]) == {}
    for blocks in ([1, 2, 3, 5], [7, 1], [9, 2, 3, 4], []):
        for instance in ("a", "b", "c", "unknown"):
            assert index.leading_held(instance, blocks) == index.match(blocks).get(instance, 0)


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


def test_match_depth_with_partial_holders_and_view_alignment() -> None:
    index = PrefixIndex()
    chain = list(range(100, 140))
    for k, depth in enumerate([40, 1, 17, 3, 40, 32, 0]):
        index.add(f"i{k}", [*chain[:depth], 999 + k])  # + a block of its own
    expected = {"i0": 40, "i1": 1, "i2": 17, "i3": 3, "i4": 40, "i5": 32}
    assert index.match(chain) == expected
    assert index.match(chain[:5]) == {k: min(v, 5) for k, v in expected.items()}
    # Rows of a view: a different order, an instance the index never saw, one it knows missing.
    view = cluster_view(7, ids=["new", "i4", "i0", "i6", "i2", "i3", "i1"])
    out = index.match_array(chain, view)
    assert out.dtype == np.int64
    assert out.tolist() == [0, 40, 40, 0, 17, 3, 1]
    assert index.match_array([5, 6], view).tolist() == [0] * 7


def test_lookup_ignores_instances_without_the_first_block() -> None:
    index = PrefixIndex()
    for k in range(300):
        index.add(f"i{k}", [k, 10_000 + k])
    index.add("hot", [7, 1, 2])
    index.add("i8", [1])  # holds block 1, but not block 7
    assert index.match([7, 1, 2]) == {"hot": 3, "i7": 1}
    assert index.match([12_345]) == {}


def test_capacity_shrink_evicts_least_recent_first() -> None:
    index = PrefixIndex()
    index.set_capacity("a", 5)
    index.add("a", [1, 2, 3, 4, 5])
    index.add("a", [2])
    index.set_capacity("a", 2)
    assert index.blocks_held("a") == 2
    assert {b for b in range(1, 6) if index.match([b])} == {5, 2}


def test_remove_then_readd_is_most_recent() -> None:
    index = PrefixIndex()
    index.set_capacity("a", 3)
    index.add("a", [1])
    index.add("a", [2])
    index.add("a", [3])
    index.remove("a", [1])
    assert index.blocks_held("a") == 2
    index.add("a", [1])  # back, as the most recent
    index.add("a", [4])  # evicts 2
    assert {b for b in range(1, 5) if index.match([b])} == {1, 3, 4}
    index.remove("a", [1, 3, 4])
    assert index.blocks_held("a") == 0
    assert index.match([1]) == {}


def test_epochs_bound_the_lru_error() -> None:
    """Capacity 640 -> epochs of 10 appends: a block touched in a later epoch outlives every
    block last touched in an earlier one, whatever the order inside an epoch."""
    capacity = 640
    epoch = capacity // EPOCHS_PER_CAPACITY
    index = PrefixIndex()
    index.set_capacity("a", capacity)
    for block in range(capacity):
        index.add("a", [block])
    old = list(range(0, 3 * epoch))  # the three least recent epochs
    index.add("a", old[: epoch // 2])  # refresh half an epoch of them
    index.add("a", list(range(10_000, 10_000 + 2 * epoch)))  # 2 epochs of new blocks: 2 evicted
    kept = {b for b in range(capacity) if index.match([b])}
    assert set(old[: epoch // 2]) <= kept
    assert index.blocks_held("a") == capacity
    assert len(set(range(capacity)) - kept) == 2 * epoch
    assert set(range(capacity)) - kept <= set(old)


class _ExactLru:
    """The previous implementation's semantics: exact LRU per instance (reference)."""

    def __init__(self) -> None:
        self.lru: dict[str, OrderedDict[int, None]] = {}
        self.capacity: dict[str, int] = {}

    def add(self, iid: str, blocks: list[int]) -> None:
        lru = self.lru.setdefault(iid, OrderedDict())
        for b in blocks:
            lru[b] = None
            lru.move_to_end(b)
        self._evict(iid)

    def remove(self, iid: str, blocks: list[int]) -> None:
        for b in blocks:
            self.lru.get(iid, OrderedDict()).pop(b, None)

    def set_capacity(self, iid: str, blocks: int) -> None:
        self.capacity[iid] = blocks
        self._evict(iid)

    def _evict(self, iid: str) -> None:
        lru = self.lru.setdefault(iid, OrderedDict())
        while len(lru) > self.capacity.get(iid, 1 << 20):
            lru.popitem(last=False)

    def match(self, blocks: list[int]) -> dict[str, int]:
        out = {}
        for iid, lru in self.lru.items():
            depth = 0
            while depth < len(blocks) and blocks[depth] in lru:
                depth += 1
            if depth:
                out[iid] = depth
        return out


def test_exact_lru_below_one_epoch_per_block() -> None:
    """Capacity <= EPOCHS_PER_CAPACITY means one-block epochs: exactly the old exact LRU (for
    adds whose blocks are distinct, as a prompt's chained hashes are)."""
    rng = random.Random(7)
    index, reference = PrefixIndex(), _ExactLru()
    ids = ["a", "b", "c"]
    for iid in ids:
        cap = rng.randint(2, EPOCHS_PER_CAPACITY)
        index.set_capacity(iid, cap)
        reference.set_capacity(iid, cap)
    for step in range(4000):
        iid = rng.choice(ids)
        roll = rng.random()
        if roll < 0.7:
            blocks = rng.sample(range(120), rng.randint(1, 6))
            index.add(iid, blocks)
            reference.add(iid, blocks)
        elif roll < 0.95:
            blocks = rng.sample(range(120), rng.randint(1, 4))
            index.remove(iid, blocks)
            reference.remove(iid, blocks)
        else:
            cap = rng.randint(2, EPOCHS_PER_CAPACITY)
            index.set_capacity(iid, cap)
            reference.set_capacity(iid, cap)
        if step % 50 == 0:
            for iid2 in ids:
                assert index.blocks_held(iid2) == len(reference.lru.get(iid2, ())), step
            for block in range(120):
                assert index.match([block]) == reference.match([block]), (step, block)


def test_add_many_loads_like_add() -> None:
    rng = np.random.default_rng(3)
    contents = {f"i{k}": rng.integers(0, 500, 300) for k in range(20)}
    bulk, one_by_one = PrefixIndex(), PrefixIndex()
    for iid in contents:
        bulk.set_capacity(iid, 150)
        one_by_one.set_capacity(iid, 150)
    bulk.add_many(contents)
    for iid, blocks in contents.items():
        for block in blocks.tolist():  # one touch at a time: exact LRU order at this capacity
            one_by_one.add(iid, [block])
    for iid in contents:
        assert bulk.blocks_held(iid) == one_by_one.blocks_held(iid) == 150
    for block in range(500):
        assert bulk.match([block]) == one_by_one.match([block])
    bulk.add_many({"i0": [1000, 1001]})  # a non-empty instance goes through add
    assert bulk.match([1000, 1001]) == {"i0": 2}
    # Then they keep evolving alike.
    for index in (bulk, one_by_one):
        index.add("i3", [7, 8, 9])
        index.remove("i4", contents["i4"][-10:].tolist())
    for block in range(500):
        assert bulk.match([block]).get("i3") == one_by_one.match([block]).get("i3")
        assert bulk.match([block]).get("i4") == one_by_one.match([block]).get("i4")


def test_blocks_nobody_holds_are_forgotten() -> None:
    index = PrefixIndex()
    index.set_capacity("a", 4)
    for start in range(0, 400, 4):
        index.add("a", list(range(start, start + 4)))
    index.add("b", [1, 2])
    index.remove("b", [1, 2])
    assert index.blocks_held("a") == 4
    assert index.distinct_blocks == 4  # only what "a" still holds has an id
    assert index.match([396, 397, 398, 399]) == {"a": 4}


def test_sorted_distinct_equals_numpy_unique() -> None:
    values = np.random.default_rng(0).integers(-50, 50, 1_000)
    assert np.array_equal(sorted_distinct(values), np.unique(values))
    assert len(sorted_distinct(np.array([], dtype=np.int64))) == 0


def test_match_array_equals_plain_sets_on_random_data() -> None:
    # Without evictions the index holds exactly what was added and not removed: the matched
    # depth per row is then the number of leading prompt blocks in that instance's set. Over
    # 64 instances (multi-word holder masks), depths beyond 255 (more than 8 bit planes), views
    # in slot order (the no-scatter path) and shuffled / partial / with unknown instances.
    rng = random.Random(11)
    ids = [f"i{k}" for k in range(70)]
    index, held = PrefixIndex(), {i: set[int]() for i in ids}
    for i in ids:
        index.set_capacity(i, 1 << 20)  # slots in order of ``ids``
    chains = [[rng.getrandbits(48) for _ in range(rng.choice([3, 40, 300, 700]))] for _ in range(6)]
    in_order = cluster_view(len(ids), ids=ids)
    for step in range(300):
        instance_id, chain = rng.choice(ids), rng.choice(chains)
        if rng.random() < 0.75:
            blocks = chain[: rng.randint(1, len(chain))]
            index.add(instance_id, blocks)
            held[instance_id].update(blocks)
        else:
            blocks = rng.sample(chain, rng.randint(1, min(len(chain), 20)))
            index.remove(instance_id, blocks)
            held[instance_id].difference_update(blocks)
        shown = [i for i in ids if rng.random() < 0.8] + ["stranger"]
        rng.shuffle(shown)
        for view in (in_order, cluster_view(len(shown), ids=shown)):
            prompt = [*rng.choice(chains)[: rng.randint(1, 700)], rng.getrandbits(48)]
            expected = []
            for i in view.instance_ids:
                depth = 0
                while depth < len(prompt) and prompt[depth] in held.get(i, ()):
                    depth += 1
                expected.append(depth)
            assert index.match_array(prompt, view).tolist() == expected, step


def test_the_block_table_is_a_dict_that_recycles_the_last_freed_id_first() -> None:
    # A table of 16 cells holding up to 8 keys: long probe runs that wrap around the end, and
    # deletions in their middle, which must leave every other key reachable.
    rng = random.Random(5)
    keys, vals = np.zeros(16, dtype=np.int64), np.full(16, -1, dtype=np.int32)
    counts = np.zeros(3, dtype=np.int64)
    hashes, free = np.zeros(64, dtype=np.int64), np.zeros(64, dtype=np.int32)
    reference: dict[int, int] = {}
    freed: list[int] = []
    handed_out = 0
    pool = [rng.getrandbits(64) - 2**63 for _ in range(12)]
    for _ in range(3000):
        key = rng.choice(pool)
        if key in reference and rng.random() < 0.5:
            prefix_kernels.release(keys, vals, counts, hashes, free, reference[key])
            freed.append(reference.pop(key))
        elif key not in reference and len(reference) == 8:
            continue
        else:
            bid = prefix_kernels.block_id(keys, vals, counts, hashes, free, key)
            if key not in reference:
                if freed:
                    reference[key] = freed.pop()
                else:
                    reference[key], handed_out = handed_out, handed_out + 1
            assert bid == reference[key]
        assert [prefix_kernels.lookup(keys, vals, x) for x in pool] == [reference.get(x, -1) for x in pool]
        assert counts.tolist() == [len(reference), handed_out, len(freed)]
