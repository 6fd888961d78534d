"""One engine's cached vLLM blocks, mapped onto TokenFleet's 512-token prefix blocks (pure)."""

from __future__ import annotations

import array
from collections.abc import Iterable, Sequence

from agents.policy.types import BLOCK_TOKENS
from agents.prompt_blocks import ROOT, block_hash
from dispatcher.engines.vllm.kv_wire import AllBlocksCleared, BlockStored, KvBatch, VllmBlockHash


class _Node:
    """Where one cached vLLM block ends in its token sequence.

    ``last``: the router hash of the last complete window ending at or before this block's end
    (``ROOT`` before the first); ``pending``: tokens since that boundary (< ``block_tokens``);
    ``tokens``: this block's own share of them; ``prev``: the node holding the share before
    (None when this block's share starts the window); ``completed``: the router hashes of the
    windows this block completed.
    """

    __slots__ = ("completed", "last", "pending", "prev", "tokens")

    def __init__(
        self,
        last: int,
        pending: int,
        tokens: array.array[int],
        prev: _Node | None,
        completed: tuple[int, ...],
    ) -> None:
        self.last = last
        self.pending = pending
        self.tokens = tokens
        self.prev = prev
        self.completed = completed


_START = _Node(ROOT, 0, array.array("I"), None, ())


class RouterBlocks:
    """One engine's cached vLLM blocks, mapped onto TokenFleet's 512-token prefix blocks.

    A router block hash is ``agents.prompt_blocks.block_hash`` chained from ``ROOT`` over the
    token ids: ``r_j = H(r_{j-1}, t[512 j : 512 (j+1)])``, so the hashes an engine's events give
    equal ``chained_block_hashes(prompt_token_ids)`` that the scheduler computes for a request.

    Each stored vLLM block (``block_size`` tokens, e.g. 32) becomes a node placed after its parent
    (``parent_block_hash``; None = the start of a sequence): with ``p`` tokens pending since the
    parent's last window boundary, a block of ``k`` tokens completes the window when
    ``p + k >= 512``, and its router hash is ``H(last, pending tokens + the block's first
    512 - p)`` (several windows if ``k > 512``). A router block is *held* while at least one
    vLLM block that completed it is cached (a count per router hash); ``apply`` reports the
    changes of one batch as net sets (stored = became held, removed = stopped being held).

    Approximations, all towards "not held" or "held slightly too long":
    - a router block is held while the vLLM block that *completed* it is, although vLLM may have
      evicted earlier blocks of the same window (eviction goes tail first, so rarely);
    - blocks whose parent is unknown (events missed, or the parent was skipped) are skipped and
      counted in ``skipped_blocks``: whatever follows them is invisible until a resync;
    - keyed blocks (LoRA, multimodal, cache salt: ``BlockStored.keyed``) are skipped too: a
      plain request with the same tokens cannot reuse them;
    - only one KV-cache group (``group_idx``, 0: full attention in a plain decoder) and the media
      in ``mediums`` count; other events are ignored (``ignored_events``).

    State: one node per cached vLLM block in the group (deleted on ``BlockRemoved``; a removed
    node stays alive only while a later node of the same open window refers to it), so it is
    bounded by the engine's cache.
    """

    def __init__(
        self,
        block_tokens: int = BLOCK_TOKENS,
        group_idx: int = 0,
        mediums: Iterable[str | None] = (None, "GPU"),
    ) -> None:
        self.block_tokens = block_tokens
        self.group_idx = group_idx
        self.mediums = frozenset(mediums)
        self._nodes: dict[VllmBlockHash, _Node] = {}
        self._held: dict[int, int] = {}
        self.skipped_blocks = 0
        self.ignored_events = 0
        self.unknown_removals = 0

    def __len__(self) -> int:
        """vLLM blocks tracked."""
        return len(self._nodes)

    @property
    def held(self) -> frozenset[int]:
        """The router hashes this engine holds now."""
        return frozenset(self._held)

    def apply(self, batch: KvBatch) -> tuple[list[int], list[int]]:
        """Apply one batch; return (stored, removed) router hashes: the net change (disjoint,
        first-touched order)."""
        before: dict[int, bool] = {}
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                for router in self._held:
                    before.setdefault(router, True)
                self._nodes.clear()
                self._held.clear()
            elif event.group_idx != self.group_idx or event.medium not in self.mediums:
                self.ignored_events += 1
            elif isinstance(event, BlockStored):
                self._store(event, before)
            else:
                self._remove(event.block_hashes, before)
        stored = [r for r, was in before.items() if not was and r in self._held]
        removed = [r for r, was in before.items() if was and r not in self._held]
        return stored, removed

    def reset(self) -> list[int]:
        """Forget everything; return the router hashes that were held (now to be removed)."""
        held = list(self._held)
        self._nodes.clear()
        self._held.clear()
        return held

    def _store(self, event: BlockStored, before: dict[int, bool]) -> None:
        count, size = len(event.block_hashes), event.block_size
        if len(event.token_ids) != count * size:
            # Some blocks were masked out (sparse attention): we cannot tell which tokens are whose.
            self.skipped_blocks += count
            return
        if event.keyed:
            self.skipped_blocks += count
            return
        if event.parent_block_hash is None:
            parent: _Node | None = _START
        else:
            parent = self._nodes.get(event.parent_block_hash)
        for index, vllm_hash in enumerate(event.block_hashes):
            known = self._nodes.get(vllm_hash)
            if known is not None:  # re-reported (vLLM's "full" report mode): nothing changes
                parent = known
                continue
            if parent is None:
                self.skipped_blocks += 1
                continue
            node = self._place(parent, event.token_ids[index * size : (index + 1) * size])
            self._nodes[vllm_hash] = node
            for router in node.completed:
                before.setdefault(router, router in self._held)
                self._held[router] = self._held.get(router, 0) + 1
            parent = node

    def _place(self, parent: _Node, tokens: Sequence[int]) -> _Node:
        need = self.block_tokens - parent.pending
        if len(tokens) < need:
            own = array.array("I", tokens)
            return _Node(
                parent.last, parent.pending + len(tokens), own, parent if parent.pending else None, ()
            )
        window = self._open_tokens(parent)
        window.extend(tokens[:need])
        last = block_hash(parent.last, window)
        completed = [last]
        rest = need
        while len(tokens) - rest >= self.block_tokens:
            last = block_hash(last, tokens[rest : rest + self.block_tokens])
            completed.append(last)
            rest += self.block_tokens
        own = array.array("I", tokens[rest:])
        return _Node(last, len(own), own, None, tuple(completed))

    @staticmethod
    def _open_tokens(node: _Node) -> array.array[int]:
        """The tokens since ``node``'s last window boundary, in order."""
        shares: list[array.array[int]] = []
        walk: _Node | None = node
        while walk is not None and walk.pending:
            shares.append(walk.tokens)
            walk = walk.prev
        window = array.array("I")
        for share in reversed(shares):
            window.extend(share)
        return window

    def _remove(self, hashes: Sequence[VllmBlockHash], before: dict[int, bool]) -> None:
        for vllm_hash in hashes:
            node = self._nodes.pop(vllm_hash, None)
            if node is None:
                self.unknown_removals += 1
                continue
            for router in node.completed:
                before.setdefault(router, True)
                left = self._held[router] - 1
                if left:
                    self._held[router] = left
                else:
                    del self._held[router]
