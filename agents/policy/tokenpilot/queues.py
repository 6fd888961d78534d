"""The prefill queued ahead on each instance, as TokenPilot's own bookkeeping (``Q_i, R_i`` in
the router's docstring): what it sent, drained at the predicted pace, clipped by first tokens."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import numpy as np

from agents.policy.common.numeric import BoolArray, FloatArray
from agents.policy.common.slots import SlotRegistry
from agents.policy.tokenpilot import kernels
from agents.policy.types import ClusterView


class _Waiting(NamedTuple):
    """A send without its first token yet."""

    key: tuple[str, int]
    due_s: float  # its predicted first token
    tokens: float  # uncached tokens to prefill
    depth: float  # its prompt's length
    placed_s: float  # when it was placed
    own: bool  # placed by this decider

    @property
    def pairs(self) -> float:
        return self.tokens * (self.depth - self.tokens * 0.5)

    def placed_after(self, first: _Waiting) -> bool:
        """Whether it reached the engine after ``first`` (or may have: placed at the same
        instant by different deciders)."""
        return self.placed_s > first.placed_s or (self.placed_s == first.placed_s and self.own != first.own)


class PrefillQueues:
    """Per instance: prefill tokens and token pairs queued ahead, draining with time.

    Kept per instance slot (a stable small integer per instance id), and as arrays aligned with
    the rows of the latest view: realigned once per snapshot (one gather, one scatter), then
    each decision is O(n) numpy, with no per-instance Python loop.

    The drain is a prediction; the sends still waiting for their first token are facts. Prefill
    is FCFS, so while the oldest of them on an instance is more than a step past its predicted
    first token (within a step is the phase of the step in progress), that instance is still
    prefilling it: the engine is slower than predicted, e.g. a long prompt on an engine whose
    attention cost grows faster than the model's. Its queue is then kept at no less than that
    request's last chunk, until its first token comes: up to one step's budget of its tokens,
    with their attention pairs at the end of its prompt (figures: docs/results/scoreboard.md,
    "How TokenPilot got here, round by round").
    """

    def __init__(self, horizon_s: float = 4.0) -> None:
        self.horizon_s = horizon_s
        # By slot: "state": tokens, pairs, as-of time; "sent": tokens and pairs ever added (never
        # drained); "recent": prefill seconds added, decayed over ``horizon_s``; "head": the
        # oldest of ``_waiting``'s due time, tokens and prompt length (inf / 0 / 0: none).
        self._slots = SlotRegistry(
            {
                "state": ((0.0, 0.0, 0.0), np.float64),
                "sent": ((0.0, 0.0), np.float64),
                "recent": (0.0, np.float64),
                "head": ((np.inf, 0.0, 0.0), np.float64),
            }
        )
        self._view: ClusterView | None = None  # the snapshot the row arrays are aligned with
        self._slot_of_row = np.zeros(0, dtype=np.int64)  # slot of each row of _view
        self.tokens = np.zeros(0)
        self.pairs = np.zeros(0)
        self.as_of = np.zeros(0)
        self.recent = np.zeros(0)
        self._drained_to = -np.inf  # every row's ``as_of`` is at least this
        # By slot: the sends without a first token yet, in the order recorded.
        self._waiting: dict[int, deque[_Waiting]] = {}
        self._row_of_slot = np.zeros(0, dtype=np.int64)  # row of each slot in _view (-1: none)
        self.head_due = np.zeros(0)  # "head", by row of _view
        self.head_tokens = np.zeros(0)
        self.head_depth = np.zeros(0)

    def aligned_to(self, view: ClusterView) -> bool:
        return self._view is not None and self._view.version == view.version

    def align(self, view: ClusterView, idle: BoolArray) -> None:
        """Rows of ``view``; ``idle`` rows (idle at their heartbeat, nothing sent since) are empty."""
        if self.aligned_to(view):
            return
        self._save()
        ids = () if self._view is None else self._view.instance_ids
        if self._view is None or (view.instance_ids is not ids and view.instance_ids != ids):
            self._slot_of_row = np.fromiter(
                (self._slots.slot(i) for i in view.instance_ids), dtype=np.int64, count=len(view)
            )
            self._row_of_slot = np.full(self._slots.capacity, -1, dtype=np.int64)
            self._row_of_slot[self._slot_of_row] = np.arange(len(view))
        slots = self._slot_of_row  # (the same rows: the same slots)
        c = self._slots.columns
        self.tokens, self.pairs, self.as_of = c["state"][:, slots]
        self.recent = c["recent"][slots]
        self.tokens[idle] = 0.0
        self.pairs[idle] = 0.0
        head = c["head"]
        for slot in slots[idle & (head[0, slots] < np.inf)]:
            self._waiting.pop(int(slot), None)  # idle at its heartbeat: nothing is prefilling
            head[:, slot] = (np.inf, 0.0, 0.0)
        self.head_due, self.head_tokens, self.head_depth = head[:, slots]
        self._drained_to = float(self.as_of.min()) if len(self.as_of) else np.inf
        self._view = view

    def drained_to(self, now_s: float) -> bool:
        """Whether every row is already advanced to ``now_s`` (``drain`` would change nothing:
        requests decided together share one ``now_s``)."""
        return now_s <= self._drained_to

    def drain(self, now_s: float, step_s: FloatArray, budget: int) -> None:
        """Advance every row to ``now_s``: ``budget`` tokens prefilled per ``step_s`` seconds.
        A send still prefilling past its predicted first token keeps its last chunk queued (class
        docstring): that chunk is the step in progress. Formulas: ``kernels.drain``."""
        decay = np.empty(len(self.tokens))
        kernels.decay_exponent(now_s, self.horizon_s, self.as_of, decay)
        np.exp(decay, out=decay)
        kernels.drain(
            now_s,
            float(budget),
            step_s,
            decay,
            self.tokens,
            self.pairs,
            self.as_of,
            self.recent,
            self.head_due,
            self.head_tokens,
            self.head_depth,
        )
        self._drained_to = now_s

    def add(
        self,
        row: int,
        tokens: float,
        pairs: float,
        seconds: float = 0.0,
        key: tuple[str, int] = ("", 0),
        due_s: float = np.inf,
        placed_s: float = -np.inf,
        own: bool = True,
    ) -> tuple[float, float]:
        """Queue send ``key`` on ``row`` (``seconds``: its predicted prefill time; ``due_s``: its
        predicted first token; ``placed_s``: when it was placed, by this decider or, ``own``
        false, by another); returns the instance's tokens and pairs ever sent, this one
        included (the mark ``first_token`` compares against)."""
        self.tokens[row] += tokens
        self.pairs[row] += pairs
        self.recent[row] += seconds
        slot = int(self._slot_of_row[row])
        waiting = self._waiting.setdefault(slot, deque())
        depth = pairs / tokens + tokens * 0.5 if tokens > 0 else 0.0  # its prompt's length
        waiting.append(_Waiting(key, due_s, tokens, depth, placed_s, own))
        if len(waiting) == 1:
            self._set_head(slot, due_s, tokens, depth)
        sent = self._slots.columns["sent"]
        sent[0, slot] += tokens
        sent[1, slot] += pairs
        return float(sent[0, slot]), float(sent[1, slot])

    def first_token(
        self, instance_id: str, mark: tuple[float, float], key: tuple[str, int] = ("", 0)
    ) -> None:
        """Request ``key``, sent at ``mark``, has its first token: prefill is FCFS, so everything
        sent there before it is prefilled, and at most what was sent after it is still queued.

        "Before" is the engine's order, which the order recorded is not when several deciders
        place: another decider's placement is recorded a log delay after it was made, behind
        this decider's sends of that delay. So a send recorded before ``key`` but placed after it
        (or at the same instant by another decider) is not taken as prefilled: it stays
        waiting, and its tokens stay queued."""
        slot = self._slots.get(instance_id)
        if slot is None:
            return
        later = np.zeros(2)  # tokens and pairs recorded before ``key``, placed after it
        waiting = self._waiting.get(slot)
        if waiting and any(entry.key == key for entry in waiting):
            ahead: list[_Waiting] = []
            while (entry := waiting.popleft()).key != key:
                ahead.append(entry)
            for other in reversed([e for e in ahead if e.placed_after(entry)]):
                waiting.appendleft(other)
                later += (other.tokens, other.pairs)
            self._new_head(slot)
        after = np.maximum(self._slots.columns["sent"][:, slot] - mark, 0.0) + later
        row = None if self._view is None else self._view.index_of.get(instance_id)
        if row is not None:
            self.tokens[row] = min(self.tokens[row], after[0])
            self.pairs[row] = min(self.pairs[row], after[1])
        else:
            state = self._slots.columns["state"][:2, slot]
            np.minimum(state, after, out=state)

    def forget(self, instance_id: str, key: tuple[str, int]) -> None:
        """Send ``key`` ended without a first token: it no longer waits for one."""
        slot = self._slots.get(instance_id)
        waiting = None if slot is None else self._waiting.get(slot)
        if slot is not None and waiting:
            kept = deque(entry for entry in waiting if entry.key != key)
            self._waiting[slot] = kept
            self._new_head(slot)

    def _new_head(self, slot: int) -> None:
        waiting = self._waiting.get(slot)
        head = waiting[0] if waiting else None
        self._set_head(slot, *((head.due_s, head.tokens, head.depth) if head else (np.inf, 0.0, 0.0)))

    def _set_head(self, slot: int, due_s: float, tokens: float, depth: float) -> None:
        self._slots.columns["head"][:, slot] = (due_s, tokens, depth)
        row = self._row_of_slot[slot] if slot < len(self._row_of_slot) else -1
        if row >= 0:
            self.head_due[row], self.head_tokens[row], self.head_depth[row] = due_s, tokens, depth

    def remove(self, instance_id: str, tokens: float, pairs: float) -> None:
        """Take out what an aborted request had left at most (not below empty)."""
        row = None if self._view is None else self._view.index_of.get(instance_id)
        if row is not None:
            self.tokens[row] = max(self.tokens[row] - tokens, 0.0)
            self.pairs[row] = max(self.pairs[row] - pairs, 0.0)
        elif instance_id in self._slots:
            state = self._slots.columns["state"][:2, self._slots.slot_of[instance_id]]
            np.maximum(state - (tokens, pairs), 0.0, out=state)

    def _save(self) -> None:
        if self._view is not None:
            c = self._slots.columns
            c["state"][:, self._slot_of_row] = (self.tokens, self.pairs, self.as_of)
            c["recent"][self._slot_of_row] = self.recent
