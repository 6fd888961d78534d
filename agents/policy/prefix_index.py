"""Approximate router-side index of which instance holds which prefix blocks.

Fed either by the router's own decisions ("this instance has just been sent these blocks") or by
the instances' KV events (stored / removed). Each instance keeps an LRU of at most
``capacity`` blocks, so the index forgets roughly when the instance's own cache would.

Lookup cost is proportional to (matched depth x holders per block): instances that do not hold
the first block are never touched.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from agents.policy.types import ClusterView


class PrefixIndex:
    """block hash -> set of instance ids, with a per-instance LRU bound."""

    def __init__(self, default_capacity_blocks: int = 1 << 20) -> None:
        self._holders: dict[int, set[str]] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}
        self._default_capacity = default_capacity_blocks
        self._sized_for: ClusterView | None = None

    def size_like(self, view: ClusterView) -> None:
        """Bound every instance of ``view`` to its reported KV capacity (once per snapshot)."""
        if self._sized_for is view:
            return
        for row, instance_id in enumerate(view.instance_ids):
            self.set_capacity(instance_id, int(view.kv_total[row]))
        self._sized_for = view

    def set_capacity(self, instance_id: str, blocks: int) -> None:
        """Bound an instance's entry count (e.g. its reported KV capacity); evicts if shrunk."""
        self._capacity[instance_id] = max(int(blocks), 1)
        self._evict(instance_id)

    def add(self, instance_id: str, blocks: Iterable[int]) -> None:
        """Record that ``instance_id`` holds ``blocks`` now (insert or refresh as most recent)."""
        lru = self._lru.get(instance_id)
        if lru is None:
            lru = self._lru[instance_id] = OrderedDict()
        holders = self._holders
        for block in blocks:
            if block in lru:
                lru.move_to_end(block)
            else:
                lru[block] = None
                owners = holders.get(block)
                if owners is None:
                    holders[block] = {instance_id}
                else:
                    owners.add(instance_id)
        self._evict(instance_id)

    def remove(self, instance_id: str, blocks: Iterable[int]) -> None:
        """Forget blocks an instance reported evicted; unknown blocks are ignored."""
        lru = self._lru.get(instance_id)
        if lru is None:
            return
        for block in blocks:
            if block in lru:
                del lru[block]
                self._drop_holder(block, instance_id)

    def blocks_held(self, instance_id: str) -> int:
        lru = self._lru.get(instance_id)
        return 0 if lru is None else len(lru)

    def match(self, blocks: Sequence[int]) -> dict[str, int]:
        """Leading blocks of ``blocks`` held by each instance holding at least the first one."""
        if not blocks:
            return {}
        first = self._holders.get(blocks[0])
        if not first:
            return {}
        live = set(first)
        matched: dict[str, int] = {}
        depth = 1
        for block in blocks[1:]:
            owners = self._holders.get(block)
            still = live & owners if owners else set()
            for gone in live - still:
                matched[gone] = depth
            live = still
            if not live:
                break
            depth += 1
        for instance_id in live:
            matched[instance_id] = depth
        return matched

    def match_array(
        self, blocks: Sequence[int], index_of: dict[str, int], size: int
    ) -> npt.NDArray[np.int64]:
        """``match`` as an array aligned with a view's rows (instances not in it are skipped)."""
        out = np.zeros(size, dtype=np.int64)
        for instance_id, depth in self.match(blocks).items():
            row = index_of.get(instance_id)
            if row is not None:
                out[row] = depth
        return out

    def _evict(self, instance_id: str) -> None:
        lru = self._lru.get(instance_id)
        if lru is None:
            return
        capacity = self._capacity.get(instance_id, self._default_capacity)
        while len(lru) > capacity:
            block, _ = lru.popitem(last=False)
            self._drop_holder(block, instance_id)

    def _drop_holder(self, block: int, instance_id: str) -> None:
        owners = self._holders.get(block)
        if owners is not None:
            owners.discard(instance_id)
            if not owners:
                del self._holders[block]
