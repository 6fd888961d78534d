"""The DC-selection baselines FleetMind is judged against.

- ``local-only``: each request stays in its home DC (today's single-cluster deployment):
  candidates = ready ∧ model (and the request's own version pin) ∧ dc = home_dc (held while the
  home has none).
- ``global-least-load``: one global pool by load: the DC with the lowest tokens in flight per
  token of KV capacity among ready instances of the model name in reachable DCs, honouring only
  the request's own ``allowed_regions`` and a health check (a heartbeat within two intervals).
  It ignores the network, the fleet's version rules and the tenants' rules, as a load balancer
  in front of every cluster would; a version the request itself names is honoured (the wire
  contract: no substitution).
"""

from __future__ import annotations

import numpy as np

from agents.policy.fleetmind.capacity import STALE_AFTER_HEARTBEATS, fresh_rows
from agents.policy.types import BoolArray, ClusterView, DcChoice, Observation, RequestView


class LocalOnly:
    name = "local-only"
    wants_kv_events = False

    def __init__(self, seed: int = 0) -> None:
        del seed

    def select(self, request: RequestView, view: ClusterView, now_s: float) -> DcChoice:
        home: BoolArray = view.serving_rows(request) & (view.dc == request.home_dc)
        return DcChoice(request.home_dc, home, "home data centre only")

    def observe(self, event: Observation) -> None:
        pass


class GlobalLeastLoad:
    name = "global-least-load"
    wants_kv_events = False

    def __init__(self, seed: int = 0, heartbeat_s: float = 0.25) -> None:
        del seed
        self.stale_after_s = STALE_AFTER_HEARTBEATS * heartbeat_s

    def select(self, request: RequestView, view: ClusterView, now_s: float) -> DcChoice:
        rows: BoolArray = (
            view.serving_rows(request) & fresh_rows(view, now_s, self.stale_after_s) & view.reachable_rows()
        )
        if request.allowed_regions:
            rows &= np.isin(view.dc, request.allowed_regions)
        best, best_load = "", float("inf")
        for dc in np.unique(view.dc[rows]):
            in_dc = rows & (view.dc == dc)
            load = view.tokens_in_flight[in_dc].sum() / max(int(view.kv_total[in_dc].sum()), 1)
            if load < best_load:
                best, best_load = str(dc), float(load)
        if not best:
            return DcChoice("", rows, "no ready instance of the model")
        return DcChoice(best, rows & (view.dc == best), f"least loaded DC ({best_load:.2f})")

    def observe(self, event: Observation) -> None:
        pass
