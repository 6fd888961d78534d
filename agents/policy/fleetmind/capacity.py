"""Real serving capacity per data centre, for one model version, from one snapshot.

An instance counts as capacity of DC d for (model, version) when

    row in d ∧ model = m ∧ version = v ∧ ready ∧ now - last_heartbeat ≤ stale_after_s

(``stale_after_s`` is ``STALE_AFTER_HEARTBEATS`` = 2 heartbeat intervals: an instance whose
heartbeats stop is out of capacity within two intervals). ``deployed`` counts the rows of d for
(m, v) whatever their state, so "not deployed here" (reject) and "deployed, not ready now"
(hold) can be told apart.
``load`` = tokens in flight / tokens the ready instances can hold in KV (0 when none is ready).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agents.policy.types import BLOCK_TOKENS, BoolArray, ClusterView


@dataclass(frozen=True, slots=True)
class DcCapacity:
    dc: str
    rows: BoolArray  # ready, fresh instances of the model version in this DC (shared: read-only)
    deployed: int
    ready: int
    tokens_in_flight: int
    token_capacity: int
    waiting: int

    @property
    def load(self) -> float:
        return self.tokens_in_flight / self.token_capacity if self.token_capacity else 0.0


STALE_AFTER_HEARTBEATS = 2
"""Heartbeat intervals after which an instance that sent none is out of capacity."""


def fresh_rows(view: ClusterView, now_s: float, stale_after_s: float) -> BoolArray:
    """Rows whose last heartbeat is at most ``stale_after_s`` old."""
    fresh: BoolArray = now_s - view.last_heartbeat_s <= stale_after_s
    return fresh


def serving_rows(
    view: ClusterView, model: str, version: str, now_s: float, stale_after_s: float
) -> BoolArray:
    """Ready, fresh rows of ``model`` at ``version`` ("" = any version)."""
    rows: BoolArray = view.ready & (view.model == model) & fresh_rows(view, now_s, stale_after_s)
    if version:
        rows &= view.model_version == version
    return rows


def aggregate(
    view: ClusterView, model: str, version: str, now_s: float, stale_after_s: float
) -> dict[str, DcCapacity]:
    """Per DC that has any row of ``model`` at ``version``: its capacity (module docstring)."""
    deployed_rows: BoolArray = view.model == model
    if version:
        deployed_rows &= view.model_version == version
    serving = serving_rows(view, model, version, now_s, stale_after_s)
    capacities = {}
    for dc in np.unique(view.dc[deployed_rows]):
        in_dc = view.dc == dc
        rows = serving & in_dc
        capacities[str(dc)] = DcCapacity(
            dc=str(dc),
            rows=rows,
            deployed=int((deployed_rows & in_dc).sum()),
            ready=int(rows.sum()),
            tokens_in_flight=int(view.tokens_in_flight[rows].sum()),
            token_capacity=int(view.kv_total[rows].sum()) * BLOCK_TOKENS,
            waiting=int(view.waiting[rows].sum()),
        )
    return capacities


def next_expiry(view: ClusterView, rows: BoolArray, stale_after_s: float) -> float:
    """When the first of ``rows`` goes stale if no heartbeat comes (inf: no row)."""
    if not rows.any():
        return float("inf")
    return float(view.last_heartbeat_s[rows].min()) + stale_after_s
