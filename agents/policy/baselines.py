"""Load-only baselines: no knowledge of prefixes or of request cost beyond its input size."""

from __future__ import annotations

import numpy as np

from agents.policy.common.numeric import BoolArray, pick_min
from agents.policy.common.selector import InstanceSelector
from agents.policy.types import ClusterView, Placement, RequestView


class RoundRobin(InstanceSelector):
    """Cycle through the candidate instances in view order."""

    name = "round-robin"

    def __init__(self, seed: int = 0) -> None:
        super().__init__(seed)
        self._next = 0

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        rows = np.flatnonzero(mask)
        row = int(rows[self._next % len(rows)])
        self._next += 1
        return Placement(row, "round-robin")


class RandomChoice(InstanceSelector):
    """Uniformly random candidate (seeded)."""

    name = "random"

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        return Placement(int(self.rng.choice(np.flatnonzero(mask))), "random")


class LeastRequest(InstanceSelector):
    """Fewest requests: load = heartbeat (waiting + running) + requests sent since that heartbeat."""

    name = "least-request"

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        sent, _ = self.in_flight.since_heartbeat(view)
        load = (view.waiting + view.running + sent).astype(np.float64)
        return Placement(pick_min(load, mask, self.rng), "least requests")


class LeastTokens(InstanceSelector):
    """Fewest tokens in flight: heartbeat tokens_in_flight + input tokens sent since then."""

    name = "least-tokens"

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        _, sent_tokens = self.in_flight.since_heartbeat(view)
        load = (view.tokens_in_flight + sent_tokens).astype(np.float64)
        return Placement(pick_min(load, mask, self.rng), "least tokens in flight")
