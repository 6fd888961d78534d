"""One instance's prefix KV cache: 512-token prefix blocks keyed by chained block hashes, held
in the engine's own allocation units.

- A block is reusable only through its whole prefix: ``match`` walks the prompt's chained
  hashes from the start and stops at the first miss.
- Blocks are reference-counted while a request uses them; unreferenced blocks stay resident
  (still reusable) until evicted, least recently used first.
- Capacity is in blocks. Two ways to take them (``EngineOptions.kv_allocation``):
  on demand, as vLLM V1's ``KVCacheManager.allocate_slots`` does (``acquire`` the prompt's
  resident prefix plus the blocks of the first chunk, then ``allocate`` one block at a time as
  the sequence grows; a block is *free* if unreferenced, cached or not, and a cached free block
  is evicted LRU when it is reused for something else); or as a reservation of every block the
  sequence may occupy (prompt + output budget) when it is first scheduled. Only full prompt
  blocks are ever shared; the rest is anonymous.

Units: the engine allocates KV in blocks of its own size (vLLM's ``block_size``); a keyed
512-token prefix block (the granularity of the prompt hashes) takes ``block_units`` of them.
``capacity``, ``referenced``, ``evictable``, ``free`` and every count passed in (``total_units``,
``count``, ``anonymous``) are in units; ``blocks`` arguments are keyed prefix blocks (hashes).
With ``block_units`` = 1 a unit is a prefix block.

Counters: ``referenced`` units are in use by running requests (keyed or anonymous);
``evictable`` units are those of keyed blocks with refcount 0; ``referenced + evictable <= capacity``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import KeysView, Sequence
from typing import Literal

KvChange = tuple[Literal["stored", "removed"], tuple[int, ...]]


class PrefixKvCache:
    def __init__(self, capacity_units: int, record_events: bool = False, block_units: int = 1) -> None:
        self.capacity = capacity_units
        self.block_units = block_units
        self.referenced = 0
        self._refcount: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.record_events = record_events
        self.events: list[KvChange] = []

    @property
    def evictable(self) -> int:
        return len(self._evictable) * self.block_units

    @property
    def free(self) -> int:
        """Units a new allocation may take now: unreferenced ones (cached blocks get evicted)."""
        return self.capacity - self.referenced

    def resident(self, block: int) -> bool:
        return block in self._refcount

    def resident_blocks(self) -> KeysView[int]:
        """Every block resident now (in use or cached), as a live view."""
        return self._refcount.keys()

    def match(self, blocks: Sequence[int]) -> int:
        """Number of leading ``blocks`` resident in the cache."""
        refcount = self._refcount
        matched = 0
        for block in blocks:
            if block not in refcount:
                break
            matched += 1
        return matched

    def acquire(self, blocks: Sequence[int], total_units: int, matched: int | None = None) -> int | None:
        """Take ``total_units`` for a sequence whose full prompt blocks are ``blocks``.

        Reuses the resident prefix (referencing it) and allocates the rest, evicting LRU
        unreferenced blocks as needed. Returns the number of reused leading (prefix) blocks, or None
        (and changes nothing) if they do not fit now. ``matched``: ``match(blocks)``, if the
        caller has just computed it.
        """
        if matched is None:
            matched = self.match(blocks)
        reused = blocks[:matched]
        refcount = self._refcount
        units = self.block_units
        reused_idle = units * sum(1 for block in reused if refcount[block] == 0)
        need = total_units - matched * units
        if need > self.capacity - self.referenced - reused_idle:
            return None
        for block in reused:
            if refcount[block] == 0:
                del self._evictable[block]
                self.referenced += units
            refcount[block] += 1
        self._evict(need)
        self.referenced += need
        return matched

    def allocate(self, count: int) -> None:
        """Take ``count`` more anonymous units (a growing sequence); the caller has checked
        ``count <= free``. LRU unreferenced blocks are evicted as needed."""
        self._evict(count)
        self.referenced += count

    def commit(self, blocks: Sequence[int]) -> None:
        """Prompt blocks a request has just computed become shareable (they were anonymous units,
        ``block_units`` each, that the caller stops counting as anonymous).

        If another request computed the same block meanwhile, this request shares that one and
        its own copy is freed.
        """
        refcount = self._refcount
        stored = []
        for block in blocks:
            count = refcount.get(block)
            if count is None:
                refcount[block] = 1
                stored.append(block)
                continue
            if count == 0:
                del self._evictable[block]
            else:
                self.referenced -= self.block_units  # our duplicate copy goes; the resident one is shared
            refcount[block] = count + 1
        if self.record_events and stored:
            self.events.append(("stored", tuple(stored)))

    def release(self, keyed: Sequence[int], anonymous: int) -> None:
        """A request ended (or was pre-empted): drop its references to its ``keyed`` blocks and
        free its ``anonymous`` units; its prompt blocks stay resident until evicted.

        Blocks are released tail first, so a prompt's tail is evicted before its shared head.
        """
        self.referenced -= anonymous
        refcount = self._refcount
        for block in reversed(keyed):
            count = refcount[block] - 1
            refcount[block] = count
            if count == 0:
                self._evictable[block] = None
                self.referenced -= self.block_units

    def _evict(self, need: int) -> None:
        """Evict LRU unreferenced blocks until ``need`` units are neither referenced nor cached."""
        removed = []
        while self.capacity - self.referenced - self.evictable < need:
            block, _ = self._evictable.popitem(last=False)
            del self._refcount[block]
            removed.append(block)
        if self.record_events and removed:
            self.events.append(("removed", tuple(removed)))
