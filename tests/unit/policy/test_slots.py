"""The one slot registry: slots in order of first appearance, columns that grow, row alignment."""

from __future__ import annotations

import numpy as np

from agents.policy.common.slots import SlotRegistry
from tests.unit.policy.helpers import cluster_view


def test_slots_are_handed_out_once_in_order_of_first_appearance() -> None:
    slots = SlotRegistry()
    assert [slots.slot(i) for i in ("b", "a", "b", "c")] == [0, 1, 0, 2]
    assert slots.ids == ["b", "a", "c"] and len(slots) == 3
    assert slots.get("a") == 1 and slots.get("z") is None and "z" not in slots


def test_columns_grow_with_the_slots_new_entries_filled() -> None:
    slots = SlotRegistry(
        {"count": (0, np.int64), "last_s": (-np.inf, np.float64), "head": ((np.inf, 0.0), np.float64)},
        capacity=2,
    )
    for k in range(2):
        slots.columns["count"][slots.slot(f"i{k}")] = k + 1
    slots.slot("i2")  # beyond the capacity: doubled
    assert slots.capacity == 4
    assert slots.columns["count"].tolist() == [1, 2, 0, 0] and slots.columns["count"].dtype == np.int64
    assert slots.columns["last_s"].tolist() == [-np.inf] * 4
    assert slots.columns["head"].shape == (2, 4) and slots.columns["head"][:, 3].tolist() == [np.inf, 0.0]


def test_rows_align_the_slots_with_a_view() -> None:
    slots = SlotRegistry()
    for instance_id in ("i2", "i0", "gone"):
        slots.slot(instance_id)
    got, rows = slots.rows(cluster_view(3))
    assert sorted(zip(got.tolist(), rows.tolist(), strict=True)) == [(0, 2), (1, 0)]
    assert not slots.identity
    ordered = SlotRegistry()
    for k in range(3):
        ordered.slot(f"i{k}")
    ordered.rows(cluster_view(3))
    assert ordered.identity
