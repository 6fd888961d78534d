"""Per-instance state kept by *slot* (a small integer per instance id, in order of first
appearance): the registry of slots and their per-slot columns (``SlotRegistry``), and the slots'
alignment with the rows of a ``ClusterView`` (``SlotRows``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from agents.policy.common.numeric import IntArray
from agents.policy.types import ClusterView


class SlotRows:
    """(slots, rows) of the instances that have a slot and are present in a view.

    Rebuilt when a new snapshot arrives (a different ``view.version``) with other rows (instance
    ids), kept when only its counts changed; extended (not rebuilt) when slots were added since:
    O(new slots) per call, one numpy pass each.
    """

    def __init__(self) -> None:
        self._version = -1
        self._instance_ids: tuple[str, ...] = ()  # the rows of the snapshots ``_version`` stands for
        self._done = 0  # slots already looked up in the view
        self._slots: IntArray = np.zeros(0, dtype=np.int64)
        self._rows: IntArray = np.zeros(0, dtype=np.int64)
        self.identity = False  # slots == rows == 0 .. len(view) - 1 (after ``of``)

    def of(self, view: ClusterView, slot_ids: Sequence[str]) -> tuple[IntArray, IntArray]:
        """``slot_ids[s]`` is the instance id of slot ``s`` (slots only ever get appended)."""
        if view.version != self._version:
            if view.instance_ids is not self._instance_ids and view.instance_ids != self._instance_ids:
                self._done, self._instance_ids = 0, view.instance_ids
                self._slots = self._rows = np.zeros(0, dtype=np.int64)
                self.identity = False
            self._version = view.version
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


Fill = float | tuple[float, ...]


class SlotRegistry:
    """A slot per instance id (a small integer, handed out in order of first appearance, never
    taken back), per-slot numpy columns that grow with the slots, and the slots' alignment with
    the rows of a view.

    ``columns``: name -> (fill, dtype). Each column is an array whose last axis is the slot; a
    fill of several values makes one row per value (shape ``(len(fill), capacity)``). A new slot
    beyond the capacity doubles it, the new entries filled. ``columns[name]`` is replaced when it
    grows: read it after ``slot``, not before.
    """

    def __init__(
        self, columns: dict[str, tuple[Fill, npt.DTypeLike]] | None = None, capacity: int = 16
    ) -> None:
        self.slot_of: dict[str, int] = {}
        self.ids: list[str] = []  # instance id by slot
        self.capacity = capacity
        self._specs = dict(columns or {})
        self.columns: dict[str, npt.NDArray[Any]] = {
            name: _filled(fill, dtype, capacity) for name, (fill, dtype) in self._specs.items()
        }
        self._rows = SlotRows()

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, instance_id: str) -> bool:
        return instance_id in self.slot_of

    def get(self, instance_id: str) -> int | None:
        """The slot of ``instance_id``; None if it has none."""
        return self.slot_of.get(instance_id)

    def slot(self, instance_id: str) -> int:
        """The slot of ``instance_id``, handed out now if it has none."""
        slot = self.slot_of.get(instance_id)
        if slot is None:
            slot = self.slot_of[instance_id] = len(self.ids)
            self.ids.append(instance_id)
            if slot >= self.capacity:
                grow = self.capacity
                for name, (fill, dtype) in self._specs.items():
                    more = _filled(fill, dtype, grow)
                    self.columns[name] = np.concatenate([self.columns[name], more], axis=-1)
                self.capacity += grow
        return slot

    def rows(self, view: ClusterView) -> tuple[IntArray, IntArray]:
        """(slots, rows) of the instances that have a slot and are present in ``view``."""
        return self._rows.of(view, self.ids)

    @property
    def identity(self) -> bool:
        """After ``rows``: slots == rows == 0 .. len(view) - 1 (a caller may skip a gather)."""
        return self._rows.identity


def _filled(fill: Fill, dtype: npt.DTypeLike, size: int) -> npt.NDArray[Any]:
    if isinstance(fill, tuple):
        return np.array([np.full(size, value, dtype=dtype) for value in fill])
    return np.full(size, fill, dtype=dtype)
