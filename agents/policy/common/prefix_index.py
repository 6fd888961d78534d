"""Approximate router-side index of which instance holds which prefix blocks.

Fed either by the router's own decisions ("this instance has just been sent these blocks") or by
the instances' KV events (stored / removed). Each instance keeps an (approximate, see below) LRU
of at most ``capacity`` blocks, so the index forgets roughly when the instance's own cache would.

Structure (sized for thousands of instances x 10^5 blocks each), all numpy arrays walked by
compiled loops (``prefix_kernels.py``, which states each array's layout):

- every instance id gets a small integer *slot* (bit ``slot`` of a holder row);
- every distinct block hash gets a dense integer *block id* (an open-addressing table hash ->
  id; ids of blocks nobody holds any more are recycled, the last freed first);
- ``held[id]`` is the row of holder bits of the block: one membership costs one bit, and
  intersecting the holders of two blocks is one ``&`` per 64 slots (64 words at 4096 instances);
- per instance, an ``int32`` ring of block ids in order of (epoch-granular) last touch, plus
  the set of ids touched in its current *epoch*. A membership costs 4 bytes of ring.

Memory: about 4 bytes per membership (+ up to ~1/4 ring slack) plus, per distinct block, 8 bytes
per 64 instances of holder row, 8 of hash and ~24 of table cell. Nothing is per (block,
instance) but the ring entry.

Costs:
- ``match`` / ``match_array``: one table probe and one row ``&`` per prompt block until no
  holder is left (a prompt whose first block nobody holds costs one probe, whatever the pool
  size); each instance's depth is written when it drops out.
- ``add``: O(1) amortised per block (probe, bit ``|``, epoch-set probe, ring append; evicting
  pops the ring head). ``remove``: O(1) per block. At each epoch end one pass over the
  instance's ring (marks by block id) drops entries superseded during that epoch.

Approximation (the LRU): an instance's touches are grouped in epochs of
``W = ceil(capacity / 64)`` appends. Blocks are evicted in order of the epoch of their last
touch, exactly; within one epoch, in order of their *first* touch in that epoch (touching a
block again in the same epoch does not move it). So an evicted block was never touched later
than any block kept, except for blocks touched in the same epoch: the error is at most one
epoch, 1/64 of the capacity (exact LRU for capacity < 65 when each ``add`` touches one block).

The compiled loops do what a pure-Python index would, operation for operation (the same ids
handed out and freed in the same order, the same ring contents); what they save:
docs/results/speed.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from agents.policy.common import prefix_kernels as k
from agents.policy.common.slots import SlotRegistry
from agents.policy.types import ClusterView

IntT = TypeVar("IntT", bound=np.integer)

EPOCHS_PER_CAPACITY = 64
"""An instance's epoch is ``ceil(capacity / EPOCHS_PER_CAPACITY)`` ring appends long."""

_EMPTY = -1


class _Instance:
    """One instance's LRU: its ring of block ids, its epoch set and its counters (``state``,
    laid out as ``prefix_kernels`` reads it)."""

    __slots__ = ("epoch", "epoch_room", "instance_id", "ring", "slot", "state")

    def __init__(self, instance_id: str, slot: int, capacity: int) -> None:
        self.instance_id = instance_id
        self.slot = slot
        self.state = np.zeros(8, dtype=np.int64)  # head, tail, epoch start, live, capacity, ...
        self.state[k.CAPACITY] = capacity
        self.state[k.EPOCH_LEN] = _epoch_len(capacity)
        self.state[k.SLOT] = slot
        # ring[head:tail] are the entries, oldest first; -1 marks a dropped entry;
        # ring[epoch start:tail] are the current epoch's entries
        self.ring: npt.NDArray[np.int32] = np.empty(16, dtype=np.int32)
        self.epoch = np.full(16, _EMPTY, dtype=np.int32)  # ids appended in the current epoch
        self.epoch_room = 0  # ids it can take without growing, at least (a Python int: cheap)

    @property
    def live(self) -> int:
        return int(self.state[k.LIVE])

    @property
    def capacity(self) -> int:
        return int(self.state[k.CAPACITY])

    def set_capacity(self, blocks: int) -> None:
        self.state[k.CAPACITY] = blocks
        self.state[k.EPOCH_LEN] = _epoch_len(blocks)

    def reserve_epoch(self, more: int) -> None:
        """Room in the epoch set for ``more`` ids (kept at most half full)."""
        if more <= self.epoch_room:
            self.epoch_room -= more
            return
        size = int(self.state[k.EPOCH_SIZE])
        if 2 * (size + more) > len(self.epoch):
            cells = np.full(_power_of_two(4 * (size + more)), _EMPTY, dtype=np.int32)
            k.set_rehash(self.epoch, cells)
            self.epoch = cells
        self.epoch_room = len(self.epoch) // 2 - size - more


def _epoch_len(capacity: int) -> int:
    return max(1, -(-capacity // EPOCHS_PER_CAPACITY))


def _power_of_two(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


class PrefixIndex:
    """block hash -> holder bits over instance slots, with a per-instance approximate LRU."""

    def __init__(self, default_capacity_blocks: int = 1 << 20) -> None:
        # The table (hash -> id), the ids' hashes, the free ids, the holder rows, the marks
        # scratch (``prefix_kernels``); grown before any call that could overflow them.
        self._keys = np.zeros(1024, dtype=np.int64)
        self._vals = np.full(1024, _EMPTY, dtype=np.int32)
        self._counts = np.zeros(3, dtype=np.int64)  # keys in the table, ids handed out, ids free
        self._hashes = np.zeros(256, dtype=np.int64)
        self._free = np.zeros(256, dtype=np.int32)
        self._held = np.zeros((256, 1), dtype=np.uint64)
        self._marks = np.zeros(257, dtype=bool)  # by block id, one spare (the -1 of a dropped entry)
        self._room = 0  # new ids the arrays take without growing, at least (a Python int: cheap)
        self._instances: dict[str, _Instance] = {}
        self._by_slot: list[_Instance] = []
        self._default_capacity = default_capacity_blocks
        self._sized_for = -1  # view version the capacities were last set from
        # and its instances and capacities (None: a capacity was set otherwise since)
        self._sized: tuple[tuple[str, ...], npt.NDArray[np.int64]] | None = None
        # Bulk loads whose holder bits are not set yet: (slot, view of its ring), blocks dropped.
        self._pending: list[tuple[int, npt.NDArray[np.int32]]] = []
        self._pending_dropped: list[npt.NDArray[np.int32]] = []
        self._slots = SlotRegistry()  # instance id by slot, for aligning slots with view rows
        self._blocks: tuple[Sequence[int], npt.NDArray[np.int64]] = ((), np.zeros(0, dtype=np.int64))

    @property
    def distinct_blocks(self) -> int:
        """Distinct blocks held by some instance (each has an id)."""
        return int(self._counts[k.KEYS])

    # --- sizing -------------------------------------------------------------------------------

    def size_like(self, view: ClusterView) -> None:
        """Bound every instance of ``view`` to its reported KV capacity (once per snapshot; a
        snapshot of the same instances reporting the same capacities changes nothing)."""
        if self._sized_for == view.version:
            return
        ids, sized = view.instance_ids, self._sized
        if (
            sized is None
            or (ids is not sized[0] and ids != sized[0])
            or not np.array_equal(view.kv_total, sized[1])
        ):
            instances = self._instances
            kv_total = view.kv_total.tolist()
            for row, instance_id in enumerate(ids):
                blocks = max(int(kv_total[row]), 1)
                inst = instances.get(instance_id)
                if inst is None or inst.capacity != blocks:
                    self._set_capacity(instance_id, blocks)
            self._sized = (ids, view.kv_total.copy())
        self._sized_for = view.version

    def set_capacity(self, instance_id: str, blocks: int) -> None:
        """Bound an instance's entry count (e.g. its reported KV capacity); evicts if shrunk."""
        self._sized = None  # (the next snapshot sizes every instance again)
        self._set_capacity(instance_id, blocks)

    def _set_capacity(self, instance_id: str, blocks: int) -> None:
        inst = self._instance(instance_id)
        if inst.live > max(int(blocks), 1):
            self._flush()
        inst.set_capacity(max(int(blocks), 1))
        self._evict(inst)
        if inst.state[k.EPOCH_SIZE] >= inst.state[k.EPOCH_LEN]:
            k.end_epoch(inst.state, inst.ring, inst.epoch, self._marks)

    # --- updates ------------------------------------------------------------------------------

    def add(self, instance_id: str, blocks: Iterable[int]) -> None:
        """Record that ``instance_id`` holds ``blocks`` now (insert or refresh as most recent)."""
        self._flush()
        inst = self._instance(instance_id)
        hashes = self._as_array(blocks)
        self._reserve(len(hashes))
        inst.reserve_epoch(len(hashes))
        inst.ring = k.add_blocks(
            hashes, inst.state, inst.ring, inst.epoch, self._keys, self._vals, self._counts,
            self._hashes, self._free, self._held, self._marks,
        )  # fmt: skip

    def add_many(self, contents: Mapping[str, Sequence[int] | npt.NDArray[np.int64]]) -> None:
        """``add(instance_id, blocks)`` for every item, in bulk (e.g. loading the instances'
        cache snapshots when the router starts). Blocks are least recent first.

        An instance that holds nothing yet is loaded in vectorised steps: it ends up holding
        the last ``capacity`` distinct blocks of its sequence, in order of their last occurrence,
        all in epochs before its current one. Other instances go through ``add``.
        """
        empty: list[tuple[_Instance, npt.NDArray[np.int64]]] = []
        for instance_id, blocks in contents.items():
            inst = self._instance(instance_id)
            if inst.live or inst.state[k.TAIL] > inst.state[k.HEAD]:
                self.add(instance_id, blocks.tolist() if isinstance(blocks, np.ndarray) else blocks)
            else:
                empty.append((inst, np.asarray(blocks, dtype=np.int64)))
        if not empty:
            return
        lengths = [len(arr) for _, arr in empty]
        all_ids = self._bulk_ids(np.concatenate([arr for _, arr in empty]))
        loaded: list[tuple[int, npt.NDArray[np.int32]]] = []
        dropped: list[npt.NDArray[np.int32]] = []
        offset = 0
        for (inst, _), n in zip(empty, lengths, strict=True):
            arr = all_ids[offset : offset + n]
            offset += n
            if len(sorted_distinct(arr)) < len(arr):  # keep each block's last occurrence
                _, first = np.unique(arr[::-1], return_index=True)
                arr = arr[np.sort(len(arr) - 1 - first)]
            if len(arr) > inst.capacity:
                dropped.append(arr[: -inst.capacity])
                arr = arr[-inst.capacity :]
            n = len(arr)
            inst.ring = np.empty(n + n // 32 + 2 * int(inst.state[k.EPOCH_LEN]) + 16, dtype=np.int32)
            inst.ring[:n] = arr
            inst.state[[k.HEAD, k.TAIL, k.START, k.LIVE]] = (0, n, n, n)
            loaded.append((inst.slot, inst.ring[:n]))
        # Holder bits are set in one pass over all pending loads, at the next update or lookup
        # (and ids nobody holds freed then, in order): the ids handed out meanwhile are those of
        # the index this one replaces, which is what keeps every later id the same.
        self._pending.extend(loaded)
        self._pending_dropped.extend(dropped)

    def _bulk_ids(self, hashes: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        """Block ids of many hashes (creating missing ones, in ascending hash order)."""
        uniq, inverse = np.unique(hashes, return_inverse=True)
        self._reserve(k.count_missing(self._keys, self._vals, uniq))
        uid = np.empty(len(uniq), dtype=np.int32)
        k.block_ids(self._keys, self._vals, self._counts, self._hashes, self._free, uniq, uid)
        out: npt.NDArray[np.int32] = uid[inverse.reshape(-1)]
        return out

    def remove(self, instance_id: str, blocks: Iterable[int]) -> None:
        """Forget blocks an instance reported evicted; unknown blocks are ignored."""
        self._flush()
        inst = self._instances.get(instance_id)
        if inst is None:
            return
        k.remove_blocks(
            self._as_array(blocks), inst.state, self._keys, self._vals, self._counts, self._hashes,
            self._free, self._held,
        )  # fmt: skip
        # The ring entries stay; they are skipped (holder bit clear) and compacted later.

    # --- lookups ------------------------------------------------------------------------------

    def blocks_held(self, instance_id: str) -> int:
        inst = self._instances.get(instance_id)
        return 0 if inst is None else inst.live

    def match(self, blocks: Sequence[int]) -> dict[str, int]:
        """Leading blocks of ``blocks`` held by each instance holding at least the first one."""
        depth = self._depth_by_slot(blocks)
        if depth is None:
            return {}
        by_slot = self._by_slot
        return {by_slot[slot].instance_id: int(depth[slot]) for slot in np.flatnonzero(depth).tolist()}

    def leading_held(self, instance_id: str, blocks: Sequence[int]) -> int:
        """``match`` for one instance: how many leading blocks of ``blocks`` it holds."""
        inst = self._instances.get(instance_id)
        if inst is None:
            return 0
        self._flush()
        return int(k.leading_held(self._as_array(blocks), self._keys, self._vals, self._held, inst.slot))

    def match_array(self, blocks: Sequence[int], view: ClusterView) -> npt.NDArray[np.int64]:
        """``match`` as an array aligned with the rows of ``view`` (instances not in it skipped)."""
        depth = self._depth_by_slot(blocks)
        if depth is None:
            return np.zeros(len(view), dtype=np.int64)
        slots, rows = self._slots.rows(view)
        if len(depth) == len(view) and self._slots.identity:
            # Slot s is row s (the usual case: the router sized the index from the view, so
            # slots were handed out in row order): the depths are the answer, no scatter.
            return depth
        out = np.zeros(len(view), dtype=np.int64)
        out[rows] = depth[slots]
        return out

    def _depth_by_slot(self, blocks: Sequence[int]) -> npt.NDArray[np.int64] | None:
        """Matched depth per slot (None if nobody holds the first block)."""
        if not len(blocks):
            return None
        self._flush()
        depth = np.empty(len(self._by_slot), dtype=np.int64)
        if not k.match_depths(self._as_array(blocks), self._keys, self._vals, self._held, depth):
            return None
        return depth

    # --- internals ----------------------------------------------------------------------------

    def _as_array(self, blocks: Iterable[int]) -> npt.NDArray[np.int64]:
        """``blocks`` as int64; the last tuple converted is kept (a decision looks its prompt up,
        then adds it: one conversion). A tuple is immutable, so the array stays right for as long
        as the tuple is kept here."""
        if blocks is self._blocks[0]:
            return self._blocks[1]
        if type(blocks) is tuple:  # (an isinstance test against an ABC costs more than this)
            hashes = np.array(blocks, dtype=np.int64).reshape(len(blocks))
            self._blocks = (blocks, hashes)
            return hashes
        if isinstance(blocks, np.ndarray):
            return np.ascontiguousarray(blocks, dtype=np.int64)
        return np.fromiter(blocks, dtype=np.int64)

    def _instance(self, instance_id: str) -> _Instance:
        inst = self._instances.get(instance_id)
        if inst is None:
            slot = self._slots.slot(instance_id)
            inst = _Instance(instance_id, slot, self._default_capacity)
            self._instances[instance_id] = inst
            self._by_slot.append(inst)
            words = (slot >> 6) + 1
            if words > self._held.shape[1]:
                held = np.zeros((len(self._held), words), dtype=np.uint64)
                held[:, : self._held.shape[1]] = self._held
                self._held = held
        return inst

    def _reserve(self, more: int) -> None:
        """Room for ``more`` new block ids: the table at most half full (a quarter after it
        grows), the arrays by id a quarter larger than needed when they grow."""
        if more <= self._room:
            self._room -= more
            return
        keys = int(self._counts[k.KEYS]) + more
        if 2 * keys > len(self._vals):
            cells = _power_of_two(2 * keys + 1)
            new_keys, new_vals = np.zeros(cells, dtype=np.int64), np.full(cells, _EMPTY, dtype=np.int32)
            k.rehash(self._keys, self._vals, new_keys, new_vals)
            self._keys, self._vals = new_keys, new_vals
        ids = int(self._counts[k.IDS]) + more
        if ids > len(self._hashes):
            size = max(ids, len(self._hashes) * 5 // 4)
            self._hashes = np.resize(self._hashes, size)
            self._free = np.resize(self._free, size)
            self._marks = np.zeros(size + 1, dtype=bool)  # (all False between calls)
            # In place where the allocator can (a large block is remapped, not copied): at 4096
            # instances the rows take gigabytes, and a copy would hold them twice for a while.
            self._held.resize((size, self._held.shape[1]), refcheck=False)
        self._room = min(len(self._vals) // 2 - keys, len(self._hashes) - ids)

    def _evict(self, inst: _Instance) -> None:
        k.evict(
            inst.state, inst.ring, inst.epoch, self._keys, self._vals, self._counts, self._hashes,
            self._free, self._held,
        )  # fmt: skip

    def _flush(self) -> None:
        """Set the holder bits of pending bulk loads (before anything reads or changes them),
        then free the ids of blocks dropped beyond a capacity that nobody holds, in id order."""
        if not self._pending:
            return
        loaded, dropped = self._pending, self._pending_dropped
        self._pending, self._pending_dropped = [], []
        for slot, bids in loaded:
            k.set_holders(self._held, slot, bids)
        if dropped:
            k.release_unheld(
                self._keys, self._vals, self._counts, self._hashes, self._free, self._held,
                sorted_distinct(np.concatenate(dropped)).astype(np.int64),
            )  # fmt: skip


def sorted_distinct(values: npt.NDArray[IntT]) -> npt.NDArray[IntT]:
    """``np.unique(values)`` through one sort. numpy 2.4's ``unique`` without return arguments
    takes a hash-table path that is far slower on integer arrays (docs/results/speed.md)."""
    ordered = np.sort(values)
    keep = np.empty(len(ordered), dtype=bool)
    keep[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
