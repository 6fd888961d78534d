"""Sessions: a request whose prompt continues one placed before stays in that request's DC.

A placed request with at least ``MIN_SESSION_BLOCKS`` full blocks leaves its last block's
chained hash -> (DC, time). A later request R whose prompt contains such a hash at position i
continues that prompt; it is the same *session* (a chat's next turn: the whole history again,
then more) unless the entry is a shared prefix — a system prompt or a document many different
prompts start with. The two are told apart by what follows: the first request to continue an
entry fixes its successor, R[i + 1]; a later request with another successor marks the entry
shared, and a shared entry never makes a session (its reuse is left to the cost, which sees the
prefix cached in each DC). A chat's turns all continue with the same next block, so they stay
one session. Entries older than ``ttl_s`` are forgotten; at most ``capacity`` are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from agents.policy.types import RequestView

MIN_SESSION_BLOCKS = 2


@dataclass(slots=True)
class _Entry:
    dc: str
    time_s: float
    successor: int | None = None  # None: nobody continued it yet
    shared: bool = False


class SessionMap:
    def __init__(self, ttl_s: float, capacity: int = 1 << 20) -> None:
        self.ttl_s, self.capacity = ttl_s, capacity
        self._entries: OrderedDict[int, _Entry] = OrderedDict()

    def dc_of(self, request: RequestView, now_s: float) -> str:
        """The DC of the session ``request`` continues ("" = a new request). Learns what
        follows the entry it matched (module docstring)."""
        hashes = request.block_hashes
        for position in range(len(hashes) - 1, MIN_SESSION_BLOCKS - 2, -1):
            entry = self._entries.get(hashes[position])
            if entry is None or now_s - entry.time_s > self.ttl_s:
                continue
            if position + 1 < len(hashes):  # an identical prompt (a retry) teaches nothing
                successor = hashes[position + 1]
                if entry.successor is None:
                    entry.successor = successor
                elif entry.successor != successor:
                    entry.shared = True
            return "" if entry.shared else entry.dc
        return ""

    def placed(self, request: RequestView, dc: str, now_s: float) -> None:
        if len(request.block_hashes) < MIN_SESSION_BLOCKS:
            return
        last = request.block_hashes[-1]
        entry = self._entries.get(last)
        if entry is None:
            self._entries[last] = _Entry(dc, now_s)
        else:
            entry.dc, entry.time_s = dc, now_s
            self._entries.move_to_end(last)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
