"""The prefix index's loops, compiled (``prefix_index.py`` owns the arrays and says what they mean).

Every kernel works on plain arrays:

- the *table* of block ids: ``keys`` (block hash, int64) and ``vals`` (block id, int32; -1 marks
  an empty cell), a power of two of cells, open addressing with linear probing from
  ``home(hash) = ((hash · 0x9E3779B97F4A7C15 mod 2**64) >> 32) mod cells``; a deletion shifts
  the entries behind it back (no tombstones). The caller keeps the load at most one half.
- ``counts``: the number of keys in the table, of ids handed out so far, and of ids in the
  ``free`` stack. A missing hash gets the id on top of ``free`` (the one freed last), else the
  next new one; an id whose holder row becomes empty is freed (``release``).
- ``held``: one row of holder bits per block id (bit ``slot % 64`` of word ``slot // 64``).
- per instance: ``state`` (head, tail, epoch start, live blocks, capacity, epoch length, epoch
  set size, slot), its ``ring`` of block ids in order of (epoch-granular) last touch (-1: an
  entry dropped), and its *epoch set*: the ids appended in its current epoch, an open-addressing
  set of int32 (-1 empty) under the same hashing.
- ``marks``: a scratch bool per block id, all False between calls.

The caller makes room before a call (table load, ids, the epoch set, ``marks``) for every block
the call may add; a kernel never grows them, except the ring, which ``add_blocks`` returns.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from agents.policy.common.compiled import kernel

# ``counts``
KEYS, IDS, FREE = 0, 1, 2
# ``state`` of an instance
HEAD, TAIL, START, LIVE, CAPACITY, EPOCH_LEN, EPOCH_SIZE, SLOT = range(8)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_EMPTY = -1

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
U64 = npt.NDArray[np.uint64]
Bools = npt.NDArray[np.bool_]


@kernel
def home(key: int, mask: int) -> int:
    """The cell a key's probe starts at in a table of ``mask + 1`` cells (a power of two, at most
    2**32: the product's bits 32 and up are the well mixed ones)."""
    return int((np.uint64(key) * _GOLDEN) >> np.uint64(32)) & mask


# --- the table: block hash -> block id --------------------------------------------------------


@kernel
def lookup(keys: I64, vals: I32, key: int) -> int:
    """The id of ``key``; -1 if it has none."""
    mask = len(vals) - 1
    i = home(key, mask)
    while vals[i] != _EMPTY:
        if keys[i] == key:
            return int(vals[i])
        i = (i + 1) & mask
    return -1


@kernel
def block_id(keys: I64, vals: I32, counts: I64, hashes: I64, free: I32, key: int) -> int:
    """The id of ``key``, handed out now if it has none (the last freed id, else a new one)."""
    mask = len(vals) - 1
    i = home(key, mask)
    while vals[i] != _EMPTY:
        if keys[i] == key:
            return int(vals[i])
        i = (i + 1) & mask
    if counts[FREE] > 0:
        counts[FREE] -= 1
        bid = int(free[counts[FREE]])
    else:
        bid = int(counts[IDS])
        counts[IDS] += 1
    hashes[bid] = key
    keys[i] = key
    vals[i] = bid
    counts[KEYS] += 1
    return bid


@kernel
def count_missing(keys: I64, vals: I32, many: I64) -> int:
    """How many hashes of ``many`` have no id."""
    missing = 0
    for key in many:
        if lookup(keys, vals, key) < 0:
            missing += 1
    return missing


@kernel
def block_ids(keys: I64, vals: I32, counts: I64, hashes: I64, free: I32, many: I64, out: I32) -> None:
    """``block_id`` of every hash of ``many``, in order, into ``out``."""
    for j in range(len(many)):
        out[j] = block_id(keys, vals, counts, hashes, free, many[j])


@kernel
def _table_delete(keys: I64, vals: I32, key: int) -> None:
    """Take ``key`` (present) out of the table."""
    mask = len(vals) - 1
    i = home(key, mask)
    while vals[i] == _EMPTY or keys[i] != key:
        i = (i + 1) & mask
    _close_gap(keys, vals, i)


@kernel
def _close_gap(keys: I64 | I32, vals: I32, i: int) -> None:
    """Empty cell ``i`` of an open-addressed table (keys ``keys``, -1 in ``vals`` = empty; a set
    passes its cells as both), shifting back the entries probed past it: no tombstones."""
    mask = len(vals) - 1
    j = i
    while True:
        j = (j + 1) & mask
        if vals[j] == _EMPTY:
            break
        k = home(keys[j], mask)
        # The entry at j stays if its home lies cyclically in (i, j]: moving it to i would put
        # it before its home, where a probe never looks.
        if (i < k <= j) if i <= j else (k > i or k <= j):
            continue
        keys[i] = keys[j]
        vals[i] = vals[j]
        i = j
    vals[i] = _EMPTY


@kernel
def release(keys: I64, vals: I32, counts: I64, hashes: I64, free: I32, bid: int) -> None:
    """``bid`` has no holder left: forget its hash and put it on top of the free ids."""
    _table_delete(keys, vals, hashes[bid])
    counts[KEYS] -= 1
    free[counts[FREE]] = bid
    counts[FREE] += 1


@kernel
def rehash(keys: I64, vals: I32, new_keys: I64, new_vals: I32) -> None:
    """Insert every entry of a table into an empty larger one."""
    mask = len(new_vals) - 1
    for j in range(len(vals)):
        if vals[j] != _EMPTY:
            i = home(keys[j], mask)
            while new_vals[i] != _EMPTY:
                i = (i + 1) & mask
            new_keys[i] = keys[j]
            new_vals[i] = vals[j]


@kernel
def is_free(keys: I64, vals: I32, hashes: I64, bid: int) -> bool:
    """Whether ``bid`` is on the free stack (its hash no longer leads to it)."""
    return lookup(keys, vals, hashes[bid]) != bid


# --- holder rows ------------------------------------------------------------------------------


@kernel
def _row_empty(held: U64, bid: int) -> bool:
    for word in held[bid]:  # noqa: SIM110  (a loop compiles; a generator in all() does not)
        if word:
            return False
    return True


@kernel
def set_holders(held: U64, slot: int, bids: I32) -> None:
    """Mark ``slot`` a holder of every id in ``bids``."""
    word = slot >> 6
    bit = np.uint64(1) << np.uint64(slot & 63)
    for bid in bids:
        held[bid, word] |= bit


@kernel
def release_unheld(keys: I64, vals: I32, counts: I64, hashes: I64, free: I32, held: U64, bids: I64) -> None:
    """Free, in the order given, every id of ``bids`` that nobody holds and that is not free yet."""
    for bid in bids:
        if _row_empty(held, bid) and not is_free(keys, vals, hashes, bid):
            release(keys, vals, counts, hashes, free, bid)


# --- an instance's epoch set ------------------------------------------------------------------


@kernel
def set_contains(cells: I32, bid: int) -> bool:
    mask = len(cells) - 1
    i = home(bid, mask)
    while cells[i] != _EMPTY:
        if cells[i] == bid:
            return True
        i = (i + 1) & mask
    return False


@kernel
def _set_add(cells: I32, bid: int) -> bool:
    """Add ``bid``; whether it was not there yet."""
    mask = len(cells) - 1
    i = home(bid, mask)
    while cells[i] != _EMPTY:
        if cells[i] == bid:
            return False
        i = (i + 1) & mask
    cells[i] = bid
    return True


@kernel
def _set_discard(cells: I32, bid: int) -> bool:
    """Take ``bid`` out (backward shift, as the table); whether it was there."""
    mask = len(cells) - 1
    i = home(bid, mask)
    while cells[i] != bid:
        if cells[i] == _EMPTY:
            return False
        i = (i + 1) & mask
    _close_gap(cells, cells, i)
    return True


@kernel
def set_rehash(cells: I32, new_cells: I32) -> None:
    for bid in cells:
        if bid != _EMPTY:
            _set_add(new_cells, bid)


# --- an instance's LRU ------------------------------------------------------------------------


@kernel
def add_blocks(
    blocks: I64,
    state: I64,
    ring: I32,
    epoch: I32,
    keys: I64,
    vals: I32,
    counts: I64,
    hashes: I64,
    free: I32,
    held: U64,
    marks: Bools,
) -> I32:
    """``PrefixIndex.add``: the instance holds ``blocks`` now. Each block gets its holder bit (a
    new membership counts as live) and, if its id is not in the current epoch yet, joins the
    epoch and is appended to the ring; then least recent blocks are evicted down to the
    capacity, and a full epoch ends. Returns the ring (a new array if it had to grow)."""
    slot = state[SLOT]
    word = slot >> 6
    bit = np.uint64(1) << np.uint64(slot & 63)
    appended = np.empty(len(blocks), dtype=np.int32)
    count = 0
    live = state[LIVE]
    for key in blocks:
        bid = block_id(keys, vals, counts, hashes, free, key)
        if not held[bid, word] & bit:
            held[bid, word] |= bit
            live += 1
        if _set_add(epoch, bid):
            state[EPOCH_SIZE] += 1
            appended[count] = bid
            count += 1
    state[LIVE] = live
    if count:
        if state[TAIL] + count > len(ring):
            ring = _make_room(state, ring, epoch, held, count)
        tail = state[TAIL]
        for j in range(count):
            ring[tail + j] = appended[j]
        state[TAIL] = tail + count
    evict(state, ring, epoch, keys, vals, counts, hashes, free, held)
    if state[EPOCH_SIZE] >= state[EPOCH_LEN]:
        end_epoch(state, ring, epoch, marks)
    return ring


@kernel
def _make_room(state: I64, ring: I32, epoch: I32, held: U64, count: int) -> I32:
    """A ring with room for ``count`` more entries: the live part compacted to the front
    (dropped entries gone; where those are most of it, also entries no longer held or touched
    again this epoch), in a larger array if it would still be over three quarters full.
    (Loops, not slices: they compile several times faster.)"""
    head, start, tail = state[HEAD], state[START], state[TAIL]
    word = state[SLOT] >> 6
    bit = np.uint64(1) << np.uint64(state[SLOT] & 63)
    kept = 0
    for j in range(head, start):
        if ring[j] >= 0:
            kept += 1
    mostly_removed = kept > 2 * state[LIVE] + 16
    if mostly_removed:
        kept = 0
        for j in range(head, start):
            bid = ring[j]
            if bid >= 0 and held[bid, word] & bit and not set_contains(epoch, bid):
                kept += 1
    n = kept + (tail - start)
    size = len(ring)
    if n + count > size * 3 // 4:
        size = max(n + count + (n + count) // 4 + 16, 16)
    fresh = np.empty(size, dtype=np.int32)
    kept = 0
    for j in range(head, start):
        bid = ring[j]
        if bid < 0:
            continue
        if mostly_removed and (not held[bid, word] & bit or set_contains(epoch, bid)):
            continue
        fresh[kept] = bid
        kept += 1
    n = kept
    for j in range(start, tail):
        fresh[n] = ring[j]
        n += 1
    state[HEAD], state[START], state[TAIL] = 0, kept, n
    return fresh


@kernel
def evict(
    state: I64, ring: I32, epoch: I32, keys: I64, vals: I32, counts: I64, hashes: I64, free: I32, held: U64
) -> None:
    """Pop the ring's head until the instance holds at most its capacity. Passed over: dropped
    entries, blocks no longer held (removed or evicted since the entry was written) and, before
    the epoch start, blocks touched again this epoch (a later entry stands for them)."""
    excess = state[LIVE] - state[CAPACITY]
    if excess <= 0:
        return
    word = state[SLOT] >> 6
    bit = np.uint64(1) << np.uint64(state[SLOT] & 63)
    head, tail, start = state[HEAD], state[TAIL], state[START]
    while excess > 0 and head < tail:
        bid = ring[head]
        head += 1  # past this entry, at ring position head - 1
        if bid < 0 or not held[bid, word] & bit:
            continue
        if head <= start:
            if set_contains(epoch, bid):
                continue
        elif _set_discard(epoch, bid):
            state[EPOCH_SIZE] -= 1
        held[bid, word] ^= bit
        if _row_empty(held, bid):
            release(keys, vals, counts, hashes, free, bid)
        excess -= 1
    state[LIVE] = state[CAPACITY] + excess
    state[HEAD] = head
    if state[START] < head:
        state[START] = head


@kernel
def end_epoch(state: I64, ring: I32, epoch: I32, marks: Bools) -> None:
    """Drop the ring entries before the epoch start whose block was appended again in the
    ending epoch (the entries from the epoch start on), then start a new, empty epoch."""
    head, start, tail = state[HEAD], state[START], state[TAIL]
    if start > head and tail > start:
        for j in range(start, tail):
            marks[ring[j]] = True
        for j in range(head, start):
            bid = ring[j]
            if bid >= 0 and marks[bid]:
                ring[j] = -1
        for j in range(start, tail):
            marks[ring[j]] = False
    for j in range(len(epoch)):
        epoch[j] = _EMPTY
    state[EPOCH_SIZE] = 0
    state[START] = tail


@kernel
def remove_blocks(
    blocks: I64, state: I64, keys: I64, vals: I32, counts: I64, hashes: I64, free: I32, held: U64
) -> None:
    """``PrefixIndex.remove``: the instance no longer holds ``blocks`` (unknown ones ignored);
    its ring entries stay, to be passed over or compacted later."""
    word = state[SLOT] >> 6
    bit = np.uint64(1) << np.uint64(state[SLOT] & 63)
    for key in blocks:
        bid = lookup(keys, vals, key)
        if bid < 0 or not held[bid, word] & bit:
            continue
        held[bid, word] ^= bit
        state[LIVE] -= 1
        if _row_empty(held, bid):
            release(keys, vals, counts, hashes, free, bid)


# --- lookups ----------------------------------------------------------------------------------


@kernel
def match_depths(blocks: I64, keys: I64, vals: I32, held: U64, depth_out: I64) -> bool:
    """The leading blocks of ``blocks`` held by each slot, into ``depth_out`` (by slot; zero
    elsewhere): walks the prompt with the holder bits still matching, and writes each slot's
    depth when it drops out. False (``depth_out`` untouched) if nobody holds the first block."""
    if len(blocks) == 0:
        return False
    bid = lookup(keys, vals, blocks[0])
    if bid < 0 or _row_empty(held, bid):
        return False
    for slot in range(len(depth_out)):
        depth_out[slot] = 0
    words = held.shape[1]
    live = np.empty(words, dtype=np.uint64)
    for w in range(words):
        live[w] = held[bid, w]
    depth = 1
    for i in range(1, len(blocks)):
        bid = lookup(keys, vals, blocks[i])
        anyone = False
        for w in range(words):
            still = live[w] & held[bid, w] if bid >= 0 else np.uint64(0)
            if still != live[w]:
                _write_depth(live[w] ^ still, w, depth, depth_out)
                live[w] = still
            if still:
                anyone = True
        if not anyone:
            return True
        depth += 1
    for w in range(words):
        if live[w]:
            _write_depth(live[w], w, depth, depth_out)
    return True


@kernel
def _write_depth(bits: np.uint64, word: int, depth: int, depth_out: I64) -> None:
    """``depth_out[slot] = depth`` for every slot of ``word`` whose bit is set in ``bits``."""
    slot = word * 64
    while bits:
        if bits & np.uint64(1):
            depth_out[slot] = depth
        bits >>= np.uint64(1)
        slot += 1


@kernel
def leading_held(blocks: I64, keys: I64, vals: I32, held: U64, slot: int) -> int:
    """How many leading blocks of ``blocks`` ``slot`` holds."""
    word = slot >> 6
    bit = np.uint64(1) << np.uint64(slot & 63)
    depth = 0
    for key in blocks:
        bid = lookup(keys, vals, key)
        if bid < 0 or not held[bid, word] & bit:
            break
        depth += 1
    return depth
