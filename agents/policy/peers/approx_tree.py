"""SGLang router's approximate per-worker prefix trees, at the granularity of our prompt blocks.

Follows ``sgl-project/sglang`` ``sgl-router/src/policies/tree.rs`` at
4d40eec0266be06d0e65b919457691cab9e51547 (``insert``, ``prefix_match``,
``evict_tenant_by_size``, ``get_smallest_tenant``), with the shipped defaults of
``sgl-router/py_src/sglang_router/router_args.py`` at 083d601378d0baaef6191e7f2d40fb70d06518af
that concern it: ``max_tree_size`` 2^26 characters, evicted every ``eviction_interval_secs``
120 (the caller, ``SglangCacheAware`` in ``sglang.py``, converts characters to tokens and
schedules the eviction).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import count

import numpy as np
import numpy.typing as npt

from agents.policy.common.numeric import IntArray
from agents.policy.common.prefix_index import PrefixIndex
from agents.policy.common.slots import SlotRegistry
from agents.policy.types import BLOCK_TOKENS, ClusterView


class ApproxTrees:
    """One multi-tenant prefix tree of routed prompts, with per-tenant last-access times and
    sizes, and leaf-LRU eviction (``Tree`` in ``sgl-router/src/policies/tree.rs``).

    Nodes are our prompt blocks (chained hashes: a block's parent is the block before it in any
    prompt holding it) plus one leaf per routed prompt for its tokens after the last full block
    (the "tail"; tails are never matched, since we cannot tell two tails apart). Sizes are in
    tokens: a block counts ``BLOCK_TOKENS``, a tail its length. SGLang counts characters; the
    caller converts its limit.

    - ``insert``: the tenant now holds every block of the prompt and its tail; every node on the
      path gets last access ``now``.
    - ``touch``: a prefix match refreshes the matched tenant's path (``prefix_match`` does).
    - ``evict(max_tokens)``: for every tenant above ``max_tokens``, remove its least recently
      accessed leaves (a node is a leaf for a tenant when the tenant holds none of its
      children) until it is at or below the limit; a parent left childless becomes a leaf.

    Membership is mirrored in a ``PrefixIndex`` so the longest match per worker is one
    vectorised ``match_array`` over the whole fleet.
    """

    def __init__(self, block_tokens: int = BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self.index = PrefixIndex()
        self._parent: dict[int, int | None] = {}  # block hash -> the block before it
        self._access: list[dict[int, float]] = []  # slot -> held block -> last access
        self._children: list[dict[int, int]] = []  # slot -> held block -> held children
        self._tails: list[dict[int, tuple[int | None, int, float]]] = []  # id -> parent, tokens, time
        self._slots = SlotRegistry({"size": (0, np.int64)})  # tokens per slot
        self._tail_ids = count()

    def insert(self, instance_id: str, blocks: Sequence[int], tail_tokens: int, now_s: float) -> None:
        slot = self._slot(instance_id)
        access, children = self._access[slot], self._children[slot]
        new: list[int] = []
        parent: int | None = None
        for block in blocks:
            if block not in access:
                new.append(block)
                self._parent.setdefault(block, parent)
                if parent is not None:
                    children[parent] = children.get(parent, 0) + 1
            access[block] = now_s
            parent = block
        if tail_tokens > 0:
            self._tails[slot][next(self._tail_ids)] = (parent, tail_tokens, now_s)
            if parent is not None:
                children[parent] = children.get(parent, 0) + 1
        self._slots.columns["size"][slot] += self.block_tokens * len(new) + max(tail_tokens, 0)
        if new:
            self.index.add(instance_id, new)

    def touch(self, instance_id: str, blocks: Sequence[int], now_s: float) -> None:
        slot = self._slots.get(instance_id)
        if slot is None:
            return
        access = self._access[slot]
        for block in blocks:
            if block not in access:
                break
            access[block] = now_s

    def evict(self, max_tokens: int) -> None:
        for slot in np.flatnonzero(self._slots.columns["size"][: len(self._slots)] > max_tokens).tolist():
            self._evict_slot(slot, max_tokens)

    def _evict_slot(self, slot: int, max_tokens: int) -> None:
        access, children, tails = self._access[slot], self._children[slot], self._tails[slot]
        # (last access, is a tail, node): blocks and tails popped oldest first.
        heap = [(t, 0, block) for block, t in access.items() if not children.get(block)]
        heap += [(t, 1, tail) for tail, (_, _, t) in tails.items()]
        heapq.heapify(heap)
        size = int(self._slots.columns["size"][slot])
        removed: list[int] = []
        while size > max_tokens and heap:
            _, is_tail, node = heapq.heappop(heap)
            if is_tail:
                parent, tokens, _ = tails.pop(node)
                size -= tokens
            else:
                if node not in access or children.get(node):
                    continue
                del access[node]
                removed.append(node)
                size -= self.block_tokens
                parent = self._parent.get(node)
            if parent is not None and parent in children:
                children[parent] -= 1
                if not children[parent]:
                    del children[parent]
                    if parent in access:
                        heapq.heappush(heap, (access[parent], 0, parent))
        self._slots.columns["size"][slot] = size
        if removed:
            self.index.remove(self._slots.ids[slot], removed)

    def match_array(self, blocks: Sequence[int], view: ClusterView) -> npt.NDArray[np.int64]:
        """Leading blocks of ``blocks`` in each row's tree."""
        return self.index.match_array(blocks, view)

    def sizes(self, view: ClusterView) -> IntArray:
        """Tree size in tokens of each row (0 for a worker never routed to)."""
        out = np.zeros(len(view), dtype=np.int64)
        slots, rows = self._slots.rows(view)
        out[rows] = self._slots.columns["size"][slots]
        return out

    def size_of(self, instance_id: str) -> int:
        slot = self._slots.get(instance_id)
        return 0 if slot is None else int(self._slots.columns["size"][slot])

    def _slot(self, instance_id: str) -> int:
        slot = self._slots.get(instance_id)
        if slot is None:
            slot = self._slots.slot(instance_id)
            self._access.append({})
            self._children.append({})
            self._tails.append({})
        return slot
