"""Alignment of per-instance state kept by *slot* (a small integer per instance id, in order of
first appearance) with the rows of a ``ClusterView``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]


class SlotRows:
    """(slots, rows) of the instances that have a slot and are present in a view's ``index_of``.

    Rebuilt when a new snapshot arrives (a different ``index_of`` object), extended (not rebuilt)
    when slots were added since: O(new slots) per call, one numpy pass each.
    """

    def __init__(self) -> None:
        self._key: dict[str, int] | None = None
        self._done = 0  # slots already looked up in _key
        self._slots: IntArray = np.zeros(0, dtype=np.int64)
        self._rows: IntArray = np.zeros(0, dtype=np.int64)

    def of(self, index_of: dict[str, int], slot_ids: Sequence[str]) -> tuple[IntArray, IntArray]:
        """``slot_ids[s]`` is the instance id of slot ``s`` (slots only ever get appended)."""
        if index_of is not self._key:
            self._key, self._done = index_of, 0
            self._slots = self._rows = np.zeros(0, dtype=np.int64)
        if self._done != len(slot_ids):
            get = index_of.get
            new = slot_ids[self._done :]
            row_of_slot = np.fromiter((get(i, -1) for i in new), dtype=np.int64, count=len(new))
            present = np.flatnonzero(row_of_slot >= 0)
            self._slots = np.concatenate([self._slots, present + self._done])
            self._rows = np.concatenate([self._rows, row_of_slot[present]])
            self._done = len(slot_ids)
        return self._slots, self._rows
