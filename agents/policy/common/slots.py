"""Alignment of per-instance state kept by *slot* (a small integer per instance id, in order of
first appearance) with the rows of a ``ClusterView``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agents.policy.common.numeric import IntArray
from agents.policy.types import ClusterView


class SlotRows:
    """(slots, rows) of the instances that have a slot and are present in a view.

    Rebuilt when a new snapshot arrives (a different ``view.version``), extended (not rebuilt)
    when slots were added since: O(new slots) per call, one numpy pass each.
    """

    def __init__(self) -> None:
        self._version = -1
        self._done = 0  # slots already looked up in the view
        self._slots: IntArray = np.zeros(0, dtype=np.int64)
        self._rows: IntArray = np.zeros(0, dtype=np.int64)
        self.identity = False  # slots == rows == 0 .. len(view) - 1 (after ``of``)

    def of(self, view: ClusterView, slot_ids: Sequence[str]) -> tuple[IntArray, IntArray]:
        """``slot_ids[s]`` is the instance id of slot ``s`` (slots only ever get appended)."""
        if view.version != self._version:
            self._version, self._done = view.version, 0
            self._slots = self._rows = np.zeros(0, dtype=np.int64)
            self.identity = False
        if self._done != len(slot_ids):
            get = view.index_of.get
            new = slot_ids[self._done :]
            row_of_slot = np.fromiter((get(i, -1) for i in new), dtype=np.int64, count=len(new))
            present = np.flatnonzero(row_of_slot >= 0)
            self._slots = np.concatenate([self._slots, present + self._done])
            self._rows = np.concatenate([self._rows, row_of_slot[present]])
            self._done = len(slot_ids)
            n = len(view)
            # Checked when the alignment changes, not per call: lets callers skip a gather.
            self.identity = (
                len(self._slots) == n
                and n == len(slot_ids)
                and bool(np.array_equal(self._slots, self._rows))
                and (n == 0 or (int(self._slots[0]) == 0 and int(self._slots[-1]) == n - 1))
            )
        return self._slots, self._rows
