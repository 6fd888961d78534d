"""Sessions: a request whose prompt continues one placed before stays in that request's DC.

A placed request leaves its last full block's chained hash → (DC, time). A later request whose
prompt contains such a hash at position ≥ ``MIN_SESSION_BLOCKS`` - 1 (so a shared system prompt
alone does not make a session) continues that conversation: its KV cache is in that DC, and
moving it would pay the whole prefill again. Entries older than ``ttl_s`` are forgotten; at most
``capacity`` are kept (oldest dropped first).
"""

from __future__ import annotations

from collections import OrderedDict

from agents.policy.types import RequestView

MIN_SESSION_BLOCKS = 2


class SessionMap:
    def __init__(self, ttl_s: float, capacity: int = 1 << 20) -> None:
        self.ttl_s, self.capacity = ttl_s, capacity
        self._last_block: OrderedDict[int, tuple[str, float]] = OrderedDict()

    def dc_of(self, request: RequestView, now_s: float) -> str:
        """The DC of the session ``request`` continues ("" = a new request)."""
        hashes = request.block_hashes
        for position in range(len(hashes) - 1, MIN_SESSION_BLOCKS - 2, -1):
            entry = self._last_block.get(hashes[position])
            if entry is not None and now_s - entry[1] <= self.ttl_s:
                return entry[0]
        return ""

    def placed(self, request: RequestView, dc: str, now_s: float) -> None:
        if len(request.block_hashes) < MIN_SESSION_BLOCKS:
            return
        last = request.block_hashes[-1]
        self._last_block[last] = (dc, now_s)
        self._last_block.move_to_end(last)
        while len(self._last_block) > self.capacity:
            self._last_block.popitem(last=False)
