"""Own in-flight accounting of an instance-selection stage: what it sent and has not seen finish."""

from __future__ import annotations

from bisect import insort
from collections import deque

import numpy as np

from agents.policy.common.numeric import IntArray, blocks_for
from agents.policy.common.slots import SlotRegistry
from agents.policy.types import ClusterView, Finished, RequestView


class InFlight:
    """Requests this router sent and has not yet seen complete, per instance.

    A router that proxies every request knows these counts exactly; heartbeats do not. It also
    remembers, per instance, what it sent after that instance's last heartbeat, so
    ``since_heartbeat`` can add to a stale snapshot exactly the work the snapshot cannot contain
    yet. Each send is forgotten once a heartbeat from its instance postdates it (or after
    ``max_age_s``, for an instance that stopped reporting): cost is amortised O(1) per send.
    Another decider's placement (``Placed``) is added with the time it was made, which may be
    older than the router's last own send: it is inserted in time order, so a heartbeat that
    postdates it forgets it.

    ``requests`` / ``blocks`` are plain dicts (instance id -> count); per-slot numpy mirrors of
    them and of the since-heartbeat totals make ``per_instance`` and ``since_heartbeat`` a few
    vectorised operations per call, plus Python work only for instances whose cut-off moved
    (a new heartbeat) and that have sends to forget. Within one snapshot, ``since_heartbeat``
    recomputes only the instances sent to since its last call (a router asks it once per
    decision, and each decision sends to one instance).
    """

    def __init__(self, max_age_s: float = 30.0) -> None:
        self.requests: dict[str, int] = {}
        self.blocks: dict[str, int] = {}
        self.max_age_s = max_age_s
        self._open: dict[tuple[str, int], tuple[str, int]] = {}
        self._recent: list[deque[tuple[float, int]]] = []  # slot -> (sent at, input tokens)
        self._slots = SlotRegistry(
            {
                "requests": (0, np.int64),  # mirror of ``requests``
                "blocks": (0, np.int64),  # mirror of ``blocks``
                "recent_requests": (0, np.int64),  # totals of ``_recent``
                "recent_tokens": (0, np.int64),
                "last_sent": (-np.inf, np.float64),  # newest send per slot
                "applied": (-np.inf, np.float64),  # cut-off ``_recent`` was last trimmed to
            }
        )
        # ``since_heartbeat``'s answer for the snapshot ``_memo_version`` (read-only arrays), and
        # the slots sent to since it was computed.
        self._memo_version = -1
        self._memo: tuple[IntArray, IntArray] = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self._memo_arrays = self._memo
        self._dirty: set[int] = set()

    def add(self, request: RequestView, instance_id: str, now_s: float) -> None:
        blocks = blocks_for(request.input_tokens)
        self._open[(request.request_id, request.attempt)] = (instance_id, blocks)
        self.requests[instance_id] = self.requests.get(instance_id, 0) + 1
        self.blocks[instance_id] = self.blocks.get(instance_id, 0) + blocks
        slot = self._slot(instance_id)
        c = self._slots.columns
        c["requests"][slot] += 1
        c["blocks"][slot] += blocks
        last_sent = c["last_sent"]
        if now_s > last_sent[slot]:
            last_sent[slot] = now_s
        self._dirty.add(slot)
        if now_s <= c["applied"][slot]:
            return  # already older than the instance's last heartbeat: nothing to add
        recent = self._recent[slot]
        if recent and recent[-1][0] > now_s:  # another decider's send, read late: keep time order
            insort(recent, (now_s, request.input_tokens))
        else:
            recent.append((now_s, request.input_tokens))
        c["recent_requests"][slot] += 1
        c["recent_tokens"][slot] += request.input_tokens

    def move(self, request: RequestView, instance_id: str, now_s: float) -> None:
        """``request``, sent before, now goes to ``instance_id`` instead (a disaggregated
        request's decode side bound late), counted there from ``now_s``."""
        sent = self._open.pop(request.key, None)
        if sent is not None:
            old, blocks = sent
            self.requests[old] -= 1
            self.blocks[old] -= blocks
            c = self._slots.columns
            slot = self._slots.slot_of[old]
            c["requests"][slot] -= 1
            c["blocks"][slot] -= blocks
        self.add(request, instance_id, now_s)

    def complete(self, completion: Finished) -> None:
        sent = self._open.pop((completion.request_id, completion.attempt), None)
        if sent is None:
            return
        instance_id, blocks = sent
        self.requests[instance_id] -= 1
        self.blocks[instance_id] -= blocks
        slot = self._slots.slot_of[instance_id]
        c = self._slots.columns
        c["requests"][slot] -= 1
        c["blocks"][slot] -= blocks

    def per_instance(self, counts: dict[str, int], view: ClusterView) -> IntArray:
        """``counts`` aligned with the rows of ``view``."""
        mirror = "requests" if counts is self.requests else "blocks" if counts is self.blocks else None
        if mirror is not None:
            slots, rows = self._slots.rows(view)
            if self._slots.identity:  # slot s is row s: a copy of the column, no scatter
                return self._slots.columns[mirror][: len(view)].copy()
            out = np.zeros(len(view), dtype=np.int64)
            out[rows] = self._slots.columns[mirror][slots]
            return out
        out = np.zeros(len(view), dtype=np.int64)
        for instance_id, count in counts.items():
            row = view.index_of.get(instance_id)
            if row is not None:
                out[row] = count
        return out

    def since_heartbeat(self, view: ClusterView) -> tuple[IntArray, IntArray]:
        """(requests, input tokens) sent to each row after that row's last heartbeat (read-only:
        the same arrays are answered again while nothing changed)."""
        if view.version == self._memo_version:
            if self._dirty:
                self._refresh_dirty(view)
            return self._memo
        requests = np.zeros(len(view), dtype=np.int64)
        tokens = np.zeros(len(view), dtype=np.int64)
        slots, rows = self._slots.rows(view)
        if len(slots):
            c = self._slots.columns
            cutoff = np.maximum(view.last_heartbeat_s[rows], c["last_sent"][slots] - self.max_age_s)
            moved = (cutoff > c["applied"][slots]) & (c["recent_requests"][slots] > 0)
            if moved.any():
                for slot, cut in zip(slots[moved].tolist(), cutoff[moved].tolist(), strict=True):
                    self._forget_until(slot, cut)
            c["applied"][slots] = np.maximum(c["applied"][slots], cutoff)
            requests[rows] = c["recent_requests"][slots]
            tokens[rows] = c["recent_tokens"][slots]
        # Answered as read-only views; ``_refresh_dirty`` writes through the arrays themselves.
        self._memo_arrays = (requests, tokens)
        answer = requests.view(), tokens.view()
        answer[0].flags.writeable = answer[1].flags.writeable = False
        self._memo_version, self._memo, self._dirty = view.version, answer, set()
        return self._memo

    def _refresh_dirty(self, view: ClusterView) -> None:
        """Bring the memo's rows of the slots sent to since up to date: the same cut-off and
        trim as a full pass (every other row's inputs are unchanged)."""
        requests, tokens = self._memo_arrays
        c = self._slots.columns
        for slot in self._dirty:
            row = view.index_of.get(self._slots.ids[slot])
            if row is None:
                continue
            cut = max(float(view.last_heartbeat_s[row]), float(c["last_sent"][slot]) - self.max_age_s)
            if cut > c["applied"][slot]:
                if c["recent_requests"][slot] > 0:
                    self._forget_until(slot, cut)
                c["applied"][slot] = cut
            requests[row] = c["recent_requests"][slot]
            tokens[row] = c["recent_tokens"][slot]
        self._dirty = set()

    def _forget_until(self, slot: int, cut: float) -> None:
        """Drop the slot's sends at or before ``cut`` from its since-heartbeat totals."""
        recent = self._recent[slot]
        gone_requests = gone_tokens = 0
        while recent and recent[0][0] <= cut:
            gone_tokens += recent.popleft()[1]
            gone_requests += 1
        c = self._slots.columns
        c["recent_requests"][slot] -= gone_requests
        c["recent_tokens"][slot] -= gone_tokens

    def _slot(self, instance_id: str) -> int:
        slot = self._slots.get(instance_id)
        if slot is None:
            slot = self._slots.slot(instance_id)
            self._recent.append(deque())
        return slot
