"""Load-only baselines: no knowledge of prefixes or of request cost beyond its input size."""

from __future__ import annotations

import numpy as np

from agents.policy.common.selector import BoolArray, Pick, RoutingPolicy, pick_min
from agents.policy.types import ClusterView, RequestView


class RoundRobin(RoutingPolicy):
    """Cycle through the candidate instances in view order."""

    name = "round-robin"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._next = 0

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Pick:
        rows = np.flatnonzero(mask)
        row = int(rows[self._next % len(rows)])
        self._next += 1
        return Pick(row, "round-robin")


class RandomChoice(RoutingPolicy):
    """Uniformly random candidate (seeded)."""

    name = "random"

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Pick:
        return Pick(int(self.rng.choice(np.flatnonzero(mask))), "random")


class LeastRequest(RoutingPolicy):
    """Fewest requests: load = heartbeat (waiting + running) + requests sent since that heartbeat."""

    name = "least-request"

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Pick:
        sent, _ = self.in_flight.since_heartbeat(view)
        load = (view.waiting + view.running + sent).astype(np.float64)
        return Pick(pick_min(load, mask, self.rng), "least requests")


class LeastTokens(RoutingPolicy):
    """Fewest tokens in flight: heartbeat tokens_in_flight + input tokens sent since then."""

    name = "least-tokens"

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Pick:
        _, sent_tokens = self.in_flight.since_heartbeat(view)
        load = (view.tokens_in_flight + sent_tokens).astype(np.float64)
        return Pick(pick_min(load, mask, self.rng), "least tokens in flight")
