"""The base of every instance-selection stage: the per-request loop and own in-flight accounting."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from agents.policy.common.inflight import InFlight
from agents.policy.common.numeric import BoolArray
from agents.policy.types import (
    BlocksChanged,
    ClusterView,
    Finished,
    FirstToken,
    Observation,
    Placed,
    Placement,
    RequestView,
)


class InstanceSelector:
    """Base for routers that place each admitted request on one candidate instance.

    Subclasses implement ``pick`` (one request, its candidate mask, never empty); this class
    runs the batch in order and keeps the router's own in-flight accounting (``in_flight``), so
    each placement is counted before the next request of the batch is decided. The hooks, in
    the order they are called: ``start_batch``; per request ``pick`` then ``on_routed``;
    ``finish_batch`` (may revise predictions, never rows); and on observations
    ``on_first_token``, ``on_kv_event`` (only with ``wants_kv_events``) and
    ``on_placed_elsewhere`` (docs/architecture/stages.md has the table).

    Several deciders per pool: another decider's placement (``Placed``) joins ``in_flight`` as
    an own send would, then ``on_placed_elsewhere`` lets the router add it to its own
    bookkeeping. A router whose replicas share no state sets ``shares_placements`` False: it
    ignores ``Placed`` altogether, as its real replicas would.

    ``lane`` (k, n; ``DecidesInLane``): this decider is number k of the pool's n. Two deciders
    deciding at the same instant do not see each other, so two requests of a burst can land on
    the same idle instance. A router that picks at random among near-equal instances breaks
    such a tie towards the instances of its own lane (``in_lane``: the CRC-32 of the instance
    id, modulo n, is k), so idle deciders spread a burst over disjoint instances; a clear
    winner is still picked wherever it is. (1 decider: one lane, no effect.)
    """

    name = "routing"
    wants_kv_events = False
    shares_placements = True

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.in_flight = InFlight()
        self.lane = (0, 1)
        self._lanes: dict[str, int] = {}  # instance id -> CRC-32 (its lane is that modulo n)

    def in_lane(self, instance_ids: Sequence[str]) -> BoolArray:
        """Whether each instance is in this decider's lane (class docstring)."""
        k, n = self.lane
        lanes = self._lanes
        for instance_id in instance_ids:
            if instance_id not in lanes:
                lanes[instance_id] = zlib.crc32(instance_id.encode())
        return np.fromiter((lanes[i] % n == k for i in instance_ids), bool, len(instance_ids))

    def pick(self, request: RequestView, view: ClusterView, mask: BoolArray, now_s: float) -> Placement:
        raise NotImplementedError

    def place(
        self,
        requests: Sequence[RequestView],
        candidates: Sequence[BoolArray],
        view: ClusterView,
        now_s: float,
    ) -> list[Placement]:
        self.start_batch(requests)
        placements = []
        for request, mask in zip(requests, candidates, strict=True):
            placement = self.pick(request, view, mask, now_s)
            self.in_flight.add(request, view.instance_ids[placement.instance], now_s)
            self.on_routed(request, view, placement.instance)
            placements.append(placement)
        return self.finish_batch(requests, placements)

    def start_batch(self, requests: Sequence[RequestView]) -> None:
        """Hook before a batch is placed."""

    def finish_batch(self, requests: Sequence[RequestView], placements: list[Placement]) -> list[Placement]:
        """Hook after a batch was placed: may revise the placements' predictions."""
        return placements

    def on_routed(self, request: RequestView, view: ClusterView, row: int) -> None:
        """Hook after a request was sent to ``row`` (e.g. remember its prefix there)."""

    def bind_decode(self, request: RequestView, view: ClusterView, decided_id: str, now_s: float) -> str:
        """``InstanceSelectionStage.bind_decode``: the decision's, by default."""
        return decided_id

    def observe(self, event: Observation) -> None:
        if isinstance(event, Finished):
            self.in_flight.complete(event)
        elif isinstance(event, BlocksChanged):
            self.on_kv_event(event)
        elif isinstance(event, Placed):
            if not self.shares_placements:
                return
            self.in_flight.add(event.request, event.instance_id, event.time_s)
            self.on_placed_elsewhere(event)
        elif isinstance(event, FirstToken):
            self.on_first_token(event)

    def on_placed_elsewhere(self, event: Placed) -> None:
        """Hook after another decider's placement was added to ``in_flight``."""

    def on_kv_event(self, event: BlocksChanged) -> None:
        """Hook for KV events (only delivered when ``wants_kv_events``)."""

    def on_first_token(self, event: FirstToken) -> None:
        """Hook for a response's first token."""
